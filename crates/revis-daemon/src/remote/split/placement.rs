//! Inside the split engine (`revisd split-engine`): reaching the nodes
//! through their tunnels, placing the layers between this machine and them,
//! and the configuration the engine then serves its tier with.

use revis_proto::Tier;

use super::flags::EngineFlags;
use crate::config::Config;

/// What a split engine runs with: its flags, the tier they name, and each
/// node's tunnel ([`engine_endpoints`](super::engine_endpoints)).
#[derive(Clone, Debug)]
pub struct EngineArgs {
    pub flags: EngineFlags,
    pub tier: Tier,
    /// (loopback endpoint of a tunnel, the node's name)
    pub rpc: Vec<(String, String)>,
}

/// In the split engine: connects to every node's RPC server (through its
/// tunnel), places the layers, and returns the engine's configuration: the
/// one model on every tier, loaded at start, server mode and lending off.
/// llama.cpp aborts this process if a node cannot be reached; the revisd
/// that started it reports that node.
pub fn engine_config(a: &EngineArgs, models_dir: &std::path::Path) -> Result<Config, String> {
    let f = &a.flags;
    let mut devices = Vec::new();
    let mut remote_free = 0u64;
    for (endpoint, name) in &a.rpc {
        let found = revis_engine::rpc::connect(endpoint).map_err(|e| format!("{name}: {e}"))?;
        for d in &found {
            tracing::info!(node = %name, free_mb = d.free_bytes >> 20, total_mb = d.total_bytes >> 20, "lent device");
            remote_free += d.free_bytes;
        }
        devices.extend(found.iter().map(|d| d.index));
    }
    let n_layer = revis_engine::rpc::layer_count(&f.model).map_err(|e| e.to_string())?;
    let plan = revis_engine::rpc::SplitPlan::new(n_layer, f.split_local, revis_engine::rpc::local_free_bytes(), remote_free);
    let names: Vec<&str> = a.rpc.iter().map(|(_, n)| n.as_str()).collect();
    let note = describe(&plan, &names);
    tracing::info!(tier = %a.tier, "{note}");
    let quote = |s: &str| toml::Value::String(s.to_owned()).to_string();
    let model = quote(&f.model.to_string_lossy());
    let mut text = format!(
        "[daemon]\nload_at_start = true\nspeculate = \"off\"\nstreams = 1\ncontext = {}\nthreads = {}\nbatch = {}\nmax_tokens_limit = {}\n\
         [server]\nenabled = false\nadvertise = false\nlend = false\nstate_dir = {}\n",
        f.context,
        match f.threads {
            revis_engine::Threads::Fixed(n) => n.to_string(),
            t => quote(&t.to_string()),
        },
        f.batch,
        f.max_tokens_limit,
        quote(&f.state_dir.to_string_lossy())
    );
    for t in Tier::ALL {
        text.push_str(&format!("[tiers.{t}]\nmodel = {model}\n"));
    }
    let mut config = Config::parse(&text, std::path::Path::new("(split engine)"), models_dir).map_err(|e| e.to_string())?;
    let split = crate::config::EngineSplit { split: revis_engine::Split { devices, remote_layers: plan.remote_layers }, note };
    for t in config.tiers.values_mut() {
        t.engine_split = Some(split.clone());
    }
    Ok(config)
}

/// "layers 1-15 here, 16-30 on desktop", for Status and the log.
pub fn describe(plan: &revis_engine::rpc::SplitPlan, nodes: &[&str]) -> String {
    let here = plan.local_layers();
    let there = if nodes.len() > 1 { format!("{} (by their free memory)", nodes.join(" and ")) } else { nodes.join("") };
    format!("layers 1-{here} here, {}-{} on {there}", here + 1, plan.n_layer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_the_placement() {
        let plan = revis_engine::rpc::SplitPlan { n_layer: 30, remote_layers: 15 };
        assert_eq!(describe(&plan, &["desktop"]), "layers 1-15 here, 16-30 on desktop");
        assert_eq!(describe(&plan, &["a", "b"]), "layers 1-15 here, 16-30 on a and b (by their free memory)");
    }
}
