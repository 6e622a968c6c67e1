//! Putting the daemon together: engine, registry, queue worker, the gRPC
//! services with health and reflection on the Unix socket, and shutdown.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use revis_engine::{Engine, LlamaCpp};
use revis_proto::v1 as pb;
use tokio::net::UnixListener;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::service::Routes;
use tonic::transport::Server;
use tonic::transport::server::UdsConnectInfo;
use tonic::{Request, Status};

use crate::config::Config;
use crate::error::DaemonError;
use crate::registry::Registry;
use crate::remote::Remote;
use crate::remote::split::Splits;
use crate::rpc::Daemon;
use crate::rpc::prompt::tokenizer_pool;
use crate::scheduler::{Queue, Task, run_queue};
use crate::transport::admission::{Admission, MAX_CONCURRENT_STREAMS};
use crate::transport::authority::AuthorityFix;
use crate::transport::socket::my_uid;
use crate::validate::GRPC_MAX_MESSAGE_BYTES;

/// How long running work may go on after a shutdown signal before it is cancelled.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// How long after cancelling the daemon waits for streams to close before it exits anyway.
pub const SHUTDOWN_HARD: Duration = Duration::from_secs(3);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("loading {model} at start failed: {source}")]
    LoadAtStart { model: String, source: revis_engine::EngineError },
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error(transparent)]
    Remote(#[from] crate::remote::RemoteError),
}

/// Only the user who runs the daemon may call it.
fn same_user(uid: u32) -> impl Fn(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |req: Request<()>| match req.extensions().get::<UdsConnectInfo>().and_then(|i| i.peer_cred) {
        Some(cred) if cred.uid() == uid => Ok(req),
        Some(cred) => Err(DaemonError::OtherUser { uid: cred.uid(), own: uid }.into()),
        None => Err(DaemonError::UnknownUser.into()),
    }
}

/// Serves until `shutdown` resolves, then drains: health goes NOT_SERVING,
/// new connections and requests are refused, running work is cancelled
/// after [`SHUTDOWN_GRACE`], and the function returns within
/// [`SHUTDOWN_HARD`] after that. `ready` is called once requests are served.
pub async fn run(
    config: Config,
    listener: UnixListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    ready: impl FnOnce(),
) -> Result<(), ServeError> {
    let engine = Engine::spawn(Arc::new(LlamaCpp));
    let registry = Arc::new(Registry::new(&config, engine.clone()));
    let splits = Arc::new(Splits::new(&config));
    if config.load_at_start {
        for m in registry.models().into_iter().filter(|m| m.split.is_empty()) {
            registry.load(&m).await.map_err(|source| ServeError::LoadAtStart { model: m.name.clone(), source })?;
        }
        // Split tiers need their nodes, which may be away now: a failure
        // here is logged, and the next call tries again.
        for engine in splits.engines() {
            if let Err(e) = engine.channel().await {
                tracing::warn!(nodes = %engine.nodes().join(", "), "a split tier did not start: {e}");
            }
        }
    }
    // Admission gives out queue_capacity + streams places (the queue and the
    // jobs running) and is the limit callers see. The queue itself has room
    // for all of them: a finished job gives its place back a moment before
    // the worker takes the next one off the queue, and the call admitted in
    // that moment must not find the queue full.
    let running = config.streams as usize;
    let queue = Arc::new(Queue::new(config.queue_capacity + running, |t: &Task| t.job.abandoned()));
    let closing = Arc::new(AtomicBool::new(false));
    let remote = Remote::new(config.server.clone(), config.tiers.keys().map(|t| t.to_string()).collect())?;
    let admission = Admission::new(config.queue_capacity, running);
    let daemon = Daemon {
        admission: admission.clone(),
        tokenizers: Arc::new(tokenizer_pool(config.render_timeout)),
        splits: splits.clone(),
        remote: remote.clone(),
        registry: registry.clone(),
        queue: queue.clone(),
        config: Arc::new(config),
        started: Instant::now(),
        closing: closing.clone(),
    };
    tokio::spawn(run_queue(queue, registry.clone(), running));
    tokio::spawn(registry.clone().unload_idle_models());

    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<pb::inference_server::InferenceServer<Daemon>>().await;
    health.set_serving::<pb::admin_server::AdminServer<Daemon>>().await;
    // Reflection v1, and v1alpha for the tools that speak only that
    // (grpcio-reflection, older grpcurl).
    let reflection_builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection = reflection_builder().build_v1().expect("the embedded descriptor sets are valid");
    let reflection_v1alpha = reflection_builder().build_v1alpha().expect("the embedded descriptor sets are valid");

    // Inference calls are admitted before their bodies are read, on both listeners.
    let inference = admission.gate(
        pb::inference_server::InferenceServer::new(daemon.clone())
            .max_decoding_message_size(GRPC_MAX_MESSAGE_BYTES)
            .max_encoding_message_size(GRPC_MAX_MESSAGE_BYTES),
    );
    let admin = pb::admin_server::AdminServer::new(daemon)
        .max_decoding_message_size(GRPC_MAX_MESSAGE_BYTES)
        .max_encoding_message_size(GRPC_MAX_MESSAGE_BYTES);

    // Paired devices reach the same services over mutual TLS (server mode).
    remote.set_routes(Routes::new(health_service.clone()).add_service(inference.clone()).add_service(admin.clone()));
    if remote.initial_switch() {
        remote.set_enabled(true, false).await?;
    }
    remote.check_lending();

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let draining = {
        let health = health.clone();
        async move {
            let _ = stop_rx.await;
            health.set_not_serving::<pb::inference_server::InferenceServer<Daemon>>().await;
            health.set_not_serving::<pb::admin_server::AdminServer<Daemon>>().await;
            health.set_service_status("", tonic_health::ServingStatus::NotServing).await;
        }
    };
    let server = Server::builder()
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .layer(tonic::service::InterceptorLayer::new(same_user(my_uid())))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(inference)
        .add_service(admin)
        // Standard clients that send the socket path as :authority (grpcio) work as they come.
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener).map(|conn| conn.map(AuthorityFix::new)), draining);
    let mut server = tokio::spawn(server);
    ready();

    tokio::select! {
        r = &mut server => return r.expect("server task").map_err(Into::into),
        () = shutdown => {}
    }
    tracing::info!("shutting down: refusing new work, draining for up to {}s", SHUTDOWN_GRACE.as_secs());
    closing.store(true, Ordering::SeqCst);
    let _ = stop_tx.send(());
    // Off the network first (advertisement withdrawn, remote calls cut); the
    // saved switch keeps its position for the next start.
    remote.set_enabled(false, false).await.ok();
    tokio::select! {
        r = &mut server => return r.expect("server task").map_err(Into::into),
        () = tokio::time::sleep(SHUTDOWN_GRACE) => {}
    }
    tracing::info!("grace period over: cancelling running work");
    engine.cancel_all();
    for e in splits.engines() {
        e.stop().await;
    }
    match tokio::time::timeout(SHUTDOWN_HARD, &mut server).await {
        Ok(r) => r.expect("server task").map_err(Into::into),
        Err(_) => {
            tracing::warn!("streams still open after {}s; exiting anyway", SHUTDOWN_HARD.as_secs());
            Ok(())
        }
    }
}
