//! Passes the OUT_DIR of llama-cpp-sys-2's build (the llama.cpp libraries
//! revis links) to the binary, so llama-bench can be linked against them.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_LLAMA_GGML_CMAKE_DIR");
    // DEP_LLAMA_GGML_CMAKE_DIR = <OUT_DIR>/lib/cmake (or lib64/cmake).
    let out = std::env::var("DEP_LLAMA_GGML_CMAKE_DIR")
        .ok()
        .and_then(|d| std::path::Path::new(&d).parent()?.parent().map(|p| p.display().to_string()))
        .unwrap_or_default();
    println!("cargo:rustc-env=REVIS_LLAMA_SYS_OUT={out}");
}
