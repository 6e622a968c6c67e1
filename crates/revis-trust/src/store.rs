//! `TrustStore`: the paired devices on disk, and `TrustSet`, the live allowlist the TLS verifier reads.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::fsutil::{read_if_exists, write_private_atomic};
use crate::{DeviceId, Result, TrustError};

/// The paired devices (JSON), mode 0600.
pub const TRUST_FILE: &str = "trusted-devices.json";
const FORMAT_VERSION: u32 = 1;
/// Longest device name, in characters.
const MAX_NAME_CHARS: usize = 64;

/// A device this node has paired with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairedDevice {
    pub device_id: DeviceId,
    /// What the user called it (shown in lists, never used for trust).
    pub name: String,
    /// Seconds since the Unix epoch.
    pub paired_at: u64,
    /// Seconds since the Unix epoch of the last accepted connection.
    pub last_seen: Option<u64>,
    /// Where it was last reached (`host:port`), on the client side: a hint
    /// for when mDNS finds nothing; the pin decides, never the address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct File {
    version: u32,
    devices: Vec<PairedDevice>,
}

/// The device IDs trusted right now, shared between the store and every TLS
/// config built from it. The verifier consults it at each handshake, so a
/// change applies to the next one.
#[derive(Clone, Debug, Default)]
pub struct TrustSet(Arc<RwLock<HashSet<DeviceId>>>);

impl TrustSet {
    /// A set holding `ids` (tests, fixed allowlists).
    pub fn new(ids: impl IntoIterator<Item = DeviceId>) -> Self {
        Self(Arc::new(RwLock::new(ids.into_iter().collect())))
    }

    /// Whether `id` is trusted now.
    pub fn contains(&self, id: &DeviceId) -> bool {
        self.0.read().unwrap_or_else(|e| e.into_inner()).contains(id)
    }

    pub(crate) fn insert(&self, id: DeviceId) {
        self.0.write().unwrap_or_else(|e| e.into_inner()).insert(id);
    }

    pub(crate) fn remove(&self, id: &DeviceId) {
        self.0.write().unwrap_or_else(|e| e.into_inner()).remove(id);
    }
}

/// The paired devices of this node, kept in [`TRUST_FILE`] in its directory.
/// Every change is written (atomically) before it returns.
#[derive(Debug)]
pub struct TrustStore {
    path: PathBuf,
    devices: Vec<PairedDevice>,
    set: TrustSet,
}

impl TrustStore {
    /// Opens the store in `dir`; no file yet means no paired devices.
    pub fn open(dir: &Path) -> Result<Self> {
        let path = dir.join(TRUST_FILE);
        let devices = match read_if_exists(&path)? {
            None => Vec::new(),
            Some(bytes) => {
                let file: File = serde_json::from_slice(&bytes).map_err(|e| TrustError::corrupt(&path, e))?;
                if file.version != FORMAT_VERSION {
                    return Err(TrustError::corrupt(&path, format!("format version {} (this revis reads {FORMAT_VERSION})", file.version)));
                }
                file.devices
            }
        };
        let set = TrustSet::new(devices.iter().map(|d| d.device_id));
        Ok(Self { path, devices, set })
    }

    /// The paired devices, in the order they were paired.
    pub fn devices(&self) -> &[PairedDevice] {
        &self.devices
    }

    /// The paired device `id`, if any.
    pub fn get(&self, id: &DeviceId) -> Option<&PairedDevice> {
        self.devices.iter().find(|d| d.device_id == *id)
    }

    /// The paired device a person means by `what`: its device ID (any
    /// spacing or case), or its name. None when nothing matches; an error
    /// when the name is shared by several devices.
    pub fn find(&self, what: &str) -> Result<Option<&PairedDevice>> {
        if let Ok(id) = what.parse::<DeviceId>() {
            return Ok(self.get(&id));
        }
        let mut named = self.devices.iter().filter(|d| d.name == what);
        match (named.next(), named.next()) {
            (Some(d), None) => Ok(Some(d)),
            (None, _) => Ok(None),
            (Some(_), Some(_)) => Err(TrustError::InvalidName("several paired devices have this name; use the device ID")),
        }
    }

    /// The live allowlist for [`crate::server_config`].
    pub fn trust_set(&self) -> TrustSet {
        self.set.clone()
    }

    /// Pairs `id` under `name` (pairing it again renames it and resets
    /// `paired_at`). Trusted only once written.
    pub fn add(&mut self, id: DeviceId, name: &str) -> Result<()> {
        check_name(name)?;
        let device = PairedDevice {
            device_id: id,
            name: name.to_owned(),
            paired_at: unix_seconds(SystemTime::now()),
            last_seen: None,
            address: None,
        };
        let mut devices = self.devices.clone();
        match devices.iter_mut().find(|d| d.device_id == id) {
            Some(d) => *d = device,
            None => devices.push(device),
        }
        self.save(&devices)?;
        self.devices = devices;
        self.set.insert(id);
        Ok(())
    }

    /// Unpairs `id`; false when it was not paired. All or nothing: the file
    /// is written (atomically) first, and only then does the device leave
    /// the list and the live set, so new handshakes fail from then on. A
    /// failed write changes nothing and is the error: the device would be
    /// trusted again after a restart, so it must not look revoked now.
    pub fn revoke(&mut self, id: &DeviceId) -> Result<bool> {
        if self.get(id).is_none() {
            return Ok(false);
        }
        let devices: Vec<PairedDevice> = self.devices.iter().filter(|d| d.device_id != *id).cloned().collect();
        self.save(&devices)?;
        self.devices = devices;
        self.set.remove(id);
        Ok(true)
    }

    /// Records that `id` connected at `at`; false when it is not paired.
    pub fn mark_seen(&mut self, id: &DeviceId, at: SystemTime) -> Result<bool> {
        let mut devices = self.devices.clone();
        let Some(d) = devices.iter_mut().find(|d| d.device_id == *id) else {
            return Ok(false);
        };
        d.last_seen = Some(unix_seconds(at));
        self.save(&devices)?;
        self.devices = devices;
        Ok(true)
    }

    /// Records where `id` was reached; false when it is not paired.
    pub fn set_address(&mut self, id: &DeviceId, address: &str) -> Result<bool> {
        let mut devices = self.devices.clone();
        let Some(d) = devices.iter_mut().find(|d| d.device_id == *id) else {
            return Ok(false);
        };
        if d.address.as_deref() == Some(address) {
            return Ok(true);
        }
        d.address = Some(address.to_owned());
        self.save(&devices)?;
        self.devices = devices;
        Ok(true)
    }

    fn save(&self, devices: &[PairedDevice]) -> Result<()> {
        let file = File { version: FORMAT_VERSION, devices: devices.to_vec() };
        let mut json = serde_json::to_vec_pretty(&file).expect("serializable");
        json.push(b'\n');
        write_private_atomic(&self.path, &json)
    }
}

pub(crate) fn check_name(name: &str) -> Result<()> {
    if name.trim().is_empty() {
        return Err(TrustError::InvalidName("empty"));
    }
    if name.chars().count() > MAX_NAME_CHARS {
        return Err(TrustError::InvalidName("longer than 64 characters"));
    }
    if name.chars().any(char::is_control) {
        return Err(TrustError::InvalidName("contains control characters"));
    }
    Ok(())
}

fn unix_seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
