//! Status, load, unload and purge.

use revis_client::wire::v1 as pb;
use revis_testkit::TestDaemon;

use crate::{ask, generate};

#[tokio::test]
async fn status_reports_tiers_and_a_shared_model_is_loaded_once() {
    let d = TestDaemon::new().start();
    let mut c = d.client().await;
    let s = c.status().await.unwrap();
    assert_eq!(s.version, env!("CARGO_PKG_VERSION"));
    let names: Vec<&str> = s.tiers.iter().map(|t| t.tier.as_str()).collect();
    assert_eq!(names, ["tier1", "tier2", "tier3"]);
    assert!(s.tiers.iter().all(|t| t.state == revis_client::ModelState::Unloaded), "loads on first use");
    generate(&mut c, ask("Hi")).await.unwrap();
    let s = c.status().await.unwrap();
    assert!(s.tiers.iter().all(|t| t.state == revis_client::ModelState::Ready), "one model serves all three tiers");
    assert_eq!(s.tiers[0].shared_with, ["tier2", "tier3"]);
}

/// Unloading gives back what loading took, measured on the same daemon:
/// RSS before the load, after it (and an answer), after the unload.
#[tokio::test]
async fn unload_frees_the_models_memory() {
    let model = revis_testkit::smollm2();
    let size = std::fs::metadata(&model).unwrap().len();
    let d = TestDaemon::new().model(model).start();
    let mut c = d.client().await;
    let baseline = c.status().await.unwrap().rss_bytes;
    c.wire().admin.load_model(pb::LoadModelRequest { tier: "tier1".into() }).await.unwrap();
    let warm = generate(&mut c, ask("Hi")).await.unwrap();
    let r = c.wire().admin.unload_model(pb::UnloadModelRequest { tier: "tier2".into() }).await.unwrap().into_inner();
    let grew = r.rss_before_bytes.saturating_sub(baseline);
    let freed = r.rss_before_bytes.saturating_sub(r.rss_after_bytes);
    let mib = |b: u64| b >> 20;
    eprintln!("RSS {} MiB; loaded +{} MiB (the file is {} MiB); unloaded -{} MiB", mib(baseline), mib(grew), mib(size), mib(freed));
    // The load is seen at all (else giving it back proves nothing) ...
    assert!(grew as f64 >= 0.5 * size as f64, "loading grew RSS by {} MiB; the model file is {} MiB", mib(grew), mib(size));
    // ... and the unload gives most of it back.
    assert!(freed as f64 >= 0.8 * grew as f64, "RSS fell by {} MiB; loading had grown it by {} MiB", mib(freed), mib(grew));
    assert_eq!(r.tier.unwrap().state, pb::ModelState::Unloaded as i32);
    // It comes back on the next use, answering as it did before.
    let again = generate(&mut c, ask("Hi")).await.unwrap();
    assert!(again.done.generated_tokens > 0);
    assert_eq!(again.done.text, warm.done.text, "the reloaded model answers as the first load did");
}

#[tokio::test]
async fn idle_models_unload_by_themselves() {
    // 2 s: long enough for the Status below to find it still loaded on a busy machine.
    let d = TestDaemon::new().daemon("keep_alive_s = 2").start();
    let mut c = d.client().await;
    generate(&mut c, ask("Hi")).await.unwrap();
    let mut status = c.wire().admin.status(pb::StatusRequest {}).await.unwrap().into_inner();
    assert_eq!(status.tiers[1].state, pb::ModelState::Ready as i32);
    // Watch the state change; the daemon's own timer does the unloading.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while status.tiers[1].state != pb::ModelState::Unloaded as i32 {
        assert!(std::time::Instant::now() < deadline, "still loaded after 10 s with keep_alive_s = 2");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        status = c.wire().admin.status(pb::StatusRequest {}).await.unwrap().into_inner();
    }
}

/// Three tiers on two files: tier1 and tier3 name SmolLM2 (tier3 through a
/// symbolic link: the same file by another path), tier2 Gemma 3. The
/// shared file costs the memory of one copy: once tier1 has loaded it,
/// loading tier3 adds next to nothing, while tier2's own file adds about its
/// size (so the measure does see a second model load).
#[tokio::test]
async fn a_shared_model_costs_the_memory_of_one_copy() {
    let (smol, gemma) = (revis_testkit::smollm2(), revis_testkit::gemma3());
    let size = |p: &std::path::Path| std::fs::metadata(p).unwrap().len();
    let (smol_size, gemma_size) = (size(&smol), size(&gemma));
    let links = tempfile::tempdir().unwrap();
    let link = links.path().join("the-same-smollm2.gguf");
    std::os::unix::fs::symlink(&smol, &link).unwrap();
    let d = TestDaemon::new().model(smol).tier_model("tier2", gemma).tier_model("tier3", link).start();
    let c = d.client().await;
    let load = async |tier: &str| {
        c.load_model(tier.parse().unwrap()).await.unwrap();
        c.status().await.unwrap()
    };
    let before = c.status().await.unwrap().rss_bytes;
    let tier1 = load("tier1").await.rss_bytes;
    let tier3 = load("tier3").await.rss_bytes;
    let s = load("tier2").await;
    let mib = |b: u64| b >> 20;
    eprintln!(
        "RSS {} MiB; +tier1 (SmolLM2, {} MiB) {} MiB; +tier3 (shared) {} MiB; +tier2 (Gemma 3, {} MiB) {} MiB",
        mib(before),
        mib(smol_size),
        mib(tier1.saturating_sub(before)),
        mib(tier3.saturating_sub(tier1)),
        mib(gemma_size),
        mib(s.rss_bytes.saturating_sub(tier3))
    );
    // Each bound is against what a load measured here costs, per byte of
    // its file: tier1's load of SmolLM2 and tier2's of Gemma 3.
    let (smol_load, gemma_load) = (tier1.saturating_sub(before), s.rss_bytes.saturating_sub(tier3));
    assert!(smol_load as f64 >= 0.5 * smol_size as f64, "loading SmolLM2 is seen in RSS");
    assert!(gemma_load as f64 >= 0.5 * gemma_size as f64, "loading a second file is seen in RSS");
    assert!(
        (tier3.saturating_sub(tier1) as f64) < 0.25 * smol_load as f64,
        "tier3 shares tier1's model, yet loading it grew RSS by {} MiB (loading that model took {} MiB)",
        mib(tier3.saturating_sub(tier1)),
        mib(smol_load)
    );
    // The state says the same: one model, its memory counted once.
    let tier = |name: &str| s.tiers.iter().find(|t| t.tier == name).unwrap().clone();
    assert_eq!(tier("tier1").shared_with, ["tier3"]);
    assert!(tier("tier2").shared_with.is_empty());
    assert_eq!(tier("tier1").memory_bytes, tier("tier3").memory_bytes);
    assert!(tier("tier1").memory_bytes > 0);
}
