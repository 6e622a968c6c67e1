//! revis-trust's integration tests: one binary, loopback only.

mod device_id;
mod handshake;
mod identity;
mod pairing;
mod store;
