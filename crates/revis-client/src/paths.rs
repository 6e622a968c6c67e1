//! Where revis keeps things, on the client's side, resolved in one place:
//! the data directory (`$REVIS_DATA_DIR`, else the platform's, see
//! [`revis_models::data_dir`]) with its models, database and keyring, and
//! the daemon's socket ([`crate::default_socket_path`]). The CLI and the GUI
//! resolve a [`Paths`] once at start-up and pass it down; nothing below them
//! reads the environment for a path.

use std::path::{Path, PathBuf};

use crate::ClientError;

/// The client's paths.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Paths {
    /// revis's data directory.
    pub data: PathBuf,
    /// This machine's daemon's socket.
    pub socket: PathBuf,
}

impl Paths {
    /// From the environment and the platform: `$REVIS_DATA_DIR` (else the
    /// platform data directory) and `$REVIS_SOCKET` (else the default socket).
    pub fn from_env() -> Result<Paths, ClientError> {
        Ok(Paths { data: revis_models::data_dir()?, socket: crate::default_socket_path() })
    }

    /// The paths of a data directory chosen by the user (the GUI's setting).
    pub fn with_data(data: &Path, socket: PathBuf) -> Paths {
        Paths { data: data.to_path_buf(), socket }
    }

    /// Downloaded models: `DATA/models`.
    pub fn models(&self) -> PathBuf {
        self.data.join("models")
    }

    /// The client's database (conversations, profile, settings): `DATA/db`.
    pub fn store(&self) -> PathBuf {
        self.data.join("db")
    }

    /// This client's identity and the nodes it paired with: `DATA/client`.
    pub fn keyring(&self) -> PathBuf {
        self.data.join("client")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn everything_lives_under_the_data_directory() {
        let p = Paths::with_data(Path::new("/d"), PathBuf::from("/run/s.sock"));
        assert_eq!((p.models(), p.store(), p.keyring()), ("/d/models".into(), "/d/db".into(), "/d/client".into()));
        // The daemon finds its models in the same place.
        assert_eq!(p.models().file_name(), revis_models::models_dir().unwrap().file_name());
    }
}
