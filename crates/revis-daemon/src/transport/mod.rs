//! Transport: how calls reach the services, before any of them runs. The
//! Unix socket and its activation (`socket.rs`), the `:authority` fix for
//! clients that send the socket path (`authority.rs`), who is calling
//! (`peer.rs`) and the admission gate in front of Inference
//! (`admission.rs`). Server mode's TLS listener (`remote/`) builds on these;
//! nothing here knows server mode.

pub mod admission;
pub mod authority;
pub mod peer;
pub mod socket;
