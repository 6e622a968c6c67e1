//! llama.cpp's RPC backend (ggml-rpc): lending this machine's CPU to a
//! paired machine, and loading a model whose later layers run on one.
//!
//! Two facts shape how revis uses it (see ARCHITECTURE.md, "One model
//! across machines"):
//! - the protocol has no authentication or encryption, so the server binds
//!   127.0.0.1 only and revisd tunnels it over mutual TLS;
//! - the client side aborts the whole process when a server disappears or
//!   answers badly (`RPC_STATUS_ASSERT` → `GGML_ABORT`), and
//!   [`serve`] never returns. So both run in child processes of their
//!   own (`revisd rpc-worker`, `revisd split-engine`), never inside revisd.
//!
//! ggml-rpc.h has no Rust bindings; its two entry points are found through
//! the RPC backend's registry (`ggml_backend_reg_get_proc_address`), with
//! the signatures of the vendored llama.cpp (RPC protocol 7).

use std::ffi::{CStr, CString, c_char};
use std::path::Path;
use std::sync::Mutex;

use llama_cpp_sys_2 as sys;

use crate::EngineError;
use crate::llama::raw_backend;

/// `ggml_backend_rpc_start_server(endpoint, cache_dir, n_threads, n_devices, devices)`.
type StartServer = unsafe extern "C" fn(*const c_char, *const c_char, usize, usize, *mut sys::ggml_backend_dev_t);
/// `ggml_backend_rpc_add_server(endpoint) -> reg` (null when it has no devices).
type AddServer = unsafe extern "C" fn(*const c_char) -> sys::ggml_backend_reg_t;

fn rpc_err(m: impl Into<String>) -> EngineError {
    EngineError::Llama(m.into())
}

/// The RPC backend's registry, or an error saying this build has none.
fn registry() -> Result<sys::ggml_backend_reg_t, EngineError> {
    raw_backend();
    // SAFETY: a NUL-terminated name; the registry lives for the process.
    let reg = unsafe { sys::ggml_backend_reg_by_name(c"RPC".as_ptr()) };
    if reg.is_null() {
        return Err(rpc_err("this build of llama.cpp has no RPC backend (build it with GGML_RPC=ON, as .cargo/config.toml does)"));
    }
    Ok(reg)
}

/// # Safety
/// `T` must be the function pointer type of the function named `name`.
unsafe fn entry<T: Copy>(name: &CStr) -> Result<T, EngineError> {
    let reg = registry()?;
    // SAFETY: the registry is valid; the name is NUL-terminated.
    let f = unsafe { sys::ggml_backend_reg_get_proc_address(reg, name.as_ptr()) };
    if f.is_null() {
        return Err(rpc_err(format!("llama.cpp's RPC backend has no {}", name.to_string_lossy())));
    }
    debug_assert_eq!(size_of::<T>(), size_of::<*mut std::ffi::c_void>());
    // SAFETY: the caller names the right signature; both are pointers.
    Ok(unsafe { std::mem::transmute_copy::<*mut std::ffi::c_void, T>(&f) })
}

/// Serves this machine's CPU over llama.cpp's RPC protocol on `endpoint`
/// (host:port; revis always gives 127.0.0.1), with `threads` threads and
/// the weight cache in `cache_dir` (a second load of the same weights
/// sends only their hashes). One client at a time. Returns only when the
/// server could not start (the port is taken, say); otherwise it serves
/// until the process ends.
pub fn serve(endpoint: &str, cache_dir: Option<&Path>, threads: u32) -> EngineError {
    let run = || -> Result<(), EngineError> {
        // SAFETY: the vendored ggml-rpc.h declares exactly this signature.
        let start: StartServer = unsafe { entry(c"ggml_backend_rpc_start_server")? };
        // SAFETY: looking up the CPU device, which a CPU build always has.
        let mut cpu = unsafe { sys::ggml_backend_dev_by_type(sys::GGML_BACKEND_DEVICE_TYPE_CPU) };
        if cpu.is_null() {
            return Err(rpc_err("llama.cpp has no CPU device to lend"));
        }
        let endpoint = CString::new(endpoint).map_err(|_| rpc_err("the endpoint has a NUL byte"))?;
        let cache = cache_dir
            .map(|d| CString::new(d.as_os_str().as_encoded_bytes()).map_err(|_| rpc_err("the cache path has a NUL byte")))
            .transpose()?;
        // SAFETY: valid C strings and one valid device, all outliving the call.
        unsafe { start(endpoint.as_ptr(), cache.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()), threads.max(1) as usize, 1, &mut cpu) };
        Ok(())
    };
    match run() {
        Ok(()) => rpc_err("llama.cpp's RPC server stopped (it prints why on stderr; is the port already taken?)"),
        Err(e) => e,
    }
}

/// A lender's devices, as llama.cpp's device list numbers them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteDevice {
    /// Index for `LlamaModelParams::with_devices`.
    pub index: usize,
    pub endpoint: String,
    pub free_bytes: u64,
    pub total_bytes: u64,
}

/// Endpoints whose devices are registered already (llama.cpp keeps them for
/// the process; registering twice would list them twice).
static REGISTERED: Mutex<Vec<(String, Vec<usize>)>> = Mutex::new(Vec::new());

/// Connects to the RPC server at `endpoint` and registers its devices with
/// llama.cpp, so a model can be loaded onto them. Aborts the process if the
/// server is unreachable (llama.cpp does): call it in a split engine only.
pub fn connect(endpoint: &str) -> Result<Vec<RemoteDevice>, EngineError> {
    let mut registered = REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
    let indices = match registered.iter().find(|(e, _)| e == endpoint) {
        Some((_, ix)) => ix.clone(),
        None => {
            // SAFETY: the vendored ggml-rpc.h declares exactly this signature.
            let add: AddServer = unsafe { entry(c"ggml_backend_rpc_add_server")? };
            let c = CString::new(endpoint).map_err(|_| rpc_err("the endpoint has a NUL byte"))?;
            // SAFETY: a valid C string; the registry returned lives for the process.
            let reg = unsafe { add(c.as_ptr()) };
            if reg.is_null() {
                return Err(rpc_err(format!("the RPC server at {endpoint} has no devices")));
            }
            let mut ix = Vec::new();
            // SAFETY: `reg` is valid; each device is registered once (REGISTERED).
            unsafe {
                for i in 0..sys::ggml_backend_reg_dev_count(reg) {
                    let dev = sys::ggml_backend_reg_dev_get(reg, i);
                    sys::ggml_backend_device_register(dev);
                    ix.push(global_index(dev).ok_or_else(|| rpc_err("a registered RPC device is not in llama.cpp's device list"))?);
                }
            }
            registered.push((endpoint.to_owned(), ix.clone()));
            ix
        }
    };
    Ok(indices
        .into_iter()
        .map(|index| {
            let (mut free, mut total) = (0usize, 0usize);
            // SAFETY: a valid device index; the outputs are plain integers.
            unsafe { sys::ggml_backend_dev_memory(sys::ggml_backend_dev_get(index), &mut free, &mut total) };
            RemoteDevice { index, endpoint: endpoint.to_owned(), free_bytes: free as u64, total_bytes: total as u64 }
        })
        .collect())
}

/// Where `dev` sits in llama.cpp's device list.
fn global_index(dev: sys::ggml_backend_dev_t) -> Option<usize> {
    // SAFETY: plain reads of llama.cpp's device list.
    (0..unsafe { sys::ggml_backend_dev_count() }).find(|&i| unsafe { sys::ggml_backend_dev_get(i) } == dev)
}

/// This machine's free memory as llama.cpp's CPU device reports it (what
/// the RPC server reports for a lender is the same figure there).
pub fn local_free_bytes() -> u64 {
    raw_backend();
    // SAFETY: the CPU device always exists in a CPU build; outputs are integers.
    unsafe {
        let cpu = sys::ggml_backend_dev_by_type(sys::GGML_BACKEND_DEVICE_TYPE_CPU);
        if cpu.is_null() {
            return 0;
        }
        let (mut free, mut total) = (0usize, 0usize);
        sys::ggml_backend_dev_memory(cpu, &mut free, &mut total);
        free as u64
    }
}

/// How a model's repeating layers are placed: llama.cpp puts the last
/// `remote_layers` on the lenders (divided among them by their free
/// memory) and the rest, with the embeddings and the output layer, here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitPlan {
    pub n_layer: u32,
    pub remote_layers: u32,
}

impl SplitPlan {
    /// `local_share` of the layers here (at least one on each side); by
    /// default in proportion to free memory here and on the lenders.
    pub fn new(n_layer: u32, local_share: Option<f64>, local_free: u64, remote_free: u64) -> SplitPlan {
        let share = local_share.unwrap_or_else(|| {
            let total = local_free.saturating_add(remote_free);
            if total == 0 { 0.5 } else { local_free as f64 / total as f64 }
        });
        let local = ((n_layer as f64) * share.clamp(0.0, 1.0)).round() as u32;
        let local = local.clamp(1.min(n_layer), n_layer.saturating_sub(1).max(1.min(n_layer)));
        SplitPlan { n_layer, remote_layers: n_layer - local }
    }

    pub fn local_layers(&self) -> u32 {
        self.n_layer - self.remote_layers
    }
}

/// The number of repeating layers of the GGUF model at `path`, read from
/// its metadata (`<arch>.block_count`) without loading the weights.
pub fn layer_count(path: &Path) -> Result<u32, EngineError> {
    use llama_cpp_2::model::LlamaModel;
    use llama_cpp_2::model::params::LlamaModelParams;
    let load_err = |reason: String| EngineError::Load { path: path.into(), reason };
    let params = LlamaModelParams::default().with_vocab_only(true);
    let model = LlamaModel::load_from_file(raw_backend(), path, &params).map_err(|e| load_err(e.to_string()))?;
    let arch = model.meta_val_str("general.architecture").map_err(|e| load_err(e.to_string()))?;
    let n = model.meta_val_str(&format!("{arch}.block_count")).map_err(|e| load_err(format!("no {arch}.block_count: {e}")))?;
    n.trim().parse().map_err(|_| load_err(format!("{arch}.block_count is {n:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_follows_the_share_and_keeps_a_layer_on_each_side() {
        assert_eq!(SplitPlan::new(30, Some(0.5), 0, 0).remote_layers, 15);
        assert_eq!(SplitPlan::new(30, Some(0.0), 0, 0).remote_layers, 29);
        assert_eq!(SplitPlan::new(30, Some(1.0), 0, 0).remote_layers, 1);
        assert_eq!(SplitPlan::new(30, Some(0.2), 0, 0).local_layers(), 6);
    }

    #[test]
    fn default_plan_follows_free_memory() {
        assert_eq!(SplitPlan::new(30, None, 1 << 30, 2 << 30).local_layers(), 10);
        assert_eq!(SplitPlan::new(30, None, 4 << 30, 4 << 30).local_layers(), 15);
        assert_eq!(SplitPlan::new(30, None, 0, 0).local_layers(), 15);
    }
}
