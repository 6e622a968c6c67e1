//! Status, load, unload and purge.

use revis_client::v1 as pb;
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
    assert!(s.tiers.iter().all(|t| t.state == pb::ModelState::Unloaded as i32), "loads on first use");
    generate(&mut c, ask("Hi")).await.unwrap();
    let s = c.status().await.unwrap();
    assert!(s.tiers.iter().all(|t| t.state == pb::ModelState::Ready as i32), "one model serves all three tiers");
    assert_eq!(s.tiers[0].shared_with, ["tier2", "tier3"]);
}

#[tokio::test]
async fn unload_frees_the_models_memory() {
    let model = revis_testkit::smollm2();
    let size = std::fs::metadata(&model).unwrap().len();
    let d = TestDaemon::new().model(model).start();
    let mut c = d.client().await;
    c.admin.load_model(pb::LoadModelRequest { tier: "tier1".into() }).await.unwrap();
    generate(&mut c, ask("Hi")).await.unwrap();
    let r = c.admin.unload_model(pb::UnloadModelRequest { tier: "tier2".into() }).await.unwrap().into_inner();
    let freed = r.rss_before_bytes.saturating_sub(r.rss_after_bytes);
    assert!(freed as f64 >= 0.8 * size as f64, "RSS fell by {} MiB; the model file is {} MiB", freed >> 20, size >> 20);
    assert_eq!(r.tier.unwrap().state, pb::ModelState::Unloaded as i32);
    // It comes back on the next use.
    assert!(generate(&mut c, ask("What is the capital of France?")).await.unwrap().done.text.contains("Paris"));
}

#[tokio::test]
async fn idle_models_unload_by_themselves() {
    // 2 s: long enough for the Status below to find it still loaded on a busy machine.
    let d = TestDaemon::new().daemon("keep_alive_s = 2").start();
    let mut c = d.client().await;
    generate(&mut c, ask("Hi")).await.unwrap();
    let mut status = c.admin.status(pb::StatusRequest {}).await.unwrap().into_inner();
    assert_eq!(status.tiers[1].state, pb::ModelState::Ready as i32);
    // Watch the state change; the daemon's own timer does the unloading.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while status.tiers[1].state != pb::ModelState::Unloaded as i32 {
        assert!(std::time::Instant::now() < deadline, "still loaded after 10 s with keep_alive_s = 2");
        tokio::task::yield_now().await;
        status = c.admin.status(pb::StatusRequest {}).await.unwrap().into_inner();
    }
}
