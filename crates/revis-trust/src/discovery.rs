//! mDNS discovery: a daemon advertises `_revis._tcp` with its device ID; a client browses for it, on chosen interfaces, over IPv4.
//!
//! An advertisement is a hint, never trust: anyone on the network can send
//! one with any device ID. What it says decides only where to dial; the
//! connection then pins the device ID (a forged advertisement fails there).
//!
//! What `mdns-sd` does not do for us, done here:
//! - A wrong interface name makes it use no interface at all, silently: every
//!   name is checked first ([`TrustError::Discovery`] names the missing one).
//! - It joins the multicast group on every interface when its daemon starts,
//!   and narrows to the chosen ones afterwards: only ever start one in
//!   production or inside a test's own network namespace.
//! - IPv6 is on by default and a first answer may carry only an `fe80::`
//!   address, which is useless to dial without its scope: IPv6 is off.

use std::ffi::CString;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use mdns_sd::{DaemonStatus, IfKind, ResolvedService, ServiceDaemon, ServiceEvent, ServiceInfo, UnregisterStatus};

use crate::store::check_name;
use crate::{DeviceId, Result, TrustError};

/// The DNS-SD service type revis daemons advertise.
pub const SERVICE_TYPE: &str = "_revis._tcp.local.";

/// TXT key: the device ID, in its readable form.
const TXT_ID: &str = "id";
/// TXT key: the device's name, as the user wrote it.
const TXT_NAME: &str = "name";
/// TXT key: the daemon's version.
const TXT_VERSION: &str = "v";
/// TXT key: the tiers it serves, comma-separated.
const TXT_TIERS: &str = "tiers";

/// Longest instance name in bytes. A DNS label holds 63; this leaves room
/// for the ` (2)` mdns-sd appends when another device has the same name.
const INSTANCE_MAX_BYTES: usize = 56;
/// Longest host name label before the device ID part, in bytes.
const HOST_NAME_MAX_BYTES: usize = 40;
/// Characters of the device ID in the host name (so two devices with the
/// same name get different host names, and so different address records).
const HOST_ID_CHARS: usize = 8;
/// How long [`Advertiser::withdraw`] waits for each answer of the mDNS
/// thread (it answers in milliseconds unless it is stuck).
const REPLY_TIMEOUT: Duration = Duration::from_secs(2);

/// Which interfaces mDNS uses. IPv4 only (an `fe80::` address is useless to
/// dial).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Interfaces {
    /// Every non-loopback interface (the production default).
    AllLan,
    /// Exactly these interface names (tests: the test's own veth).
    Named(Vec<String>),
}

/// What a daemon advertises. TXT keys: `id` (the device ID's readable
/// form), `name`, `v` (version), `tiers` (comma-separated).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Advertisement {
    /// The device's name (the rules of a paired device's name: 1 to 64
    /// characters, no control characters).
    pub name: String,
    pub device_id: DeviceId,
    /// The TCP port the daemon serves on.
    pub port: u16,
    pub version: String,
    /// Tier names; none may be empty or contain a comma.
    pub tiers: Vec<String>,
}

/// A running advertisement. [`Advertiser::withdraw`] unregisters it
/// (goodbye packets, so browsers drop it within about a second) and stops
/// the mDNS daemon; dropping it does the same without waiting.
pub struct Advertiser {
    daemon: Mdns,
    fullname: String,
}

/// One resolved advertisement. Unauthenticated: dial it, then pin
/// `device_id`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Discovered {
    pub name: String,
    pub device_id: DeviceId,
    /// IPv4 only, with the advertised port; sorted, never empty.
    pub addresses: Vec<SocketAddr>,
    pub version: String,
    pub tiers: Vec<String>,
}

impl std::fmt::Debug for Advertiser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Advertiser").field("fullname", &self.fullname).finish_non_exhaustive()
    }
}

impl Advertiser {
    /// Starts an mDNS daemon on `interfaces` and advertises `ad` there,
    /// with the IPv4 addresses those interfaces have (kept up to date as
    /// they change). Names are probed first, so browsers see it after
    /// about a second. Errors: an invalid advertisement or a missing
    /// interface (checked before anything is sent), or mdns-sd refusing.
    pub fn start(ad: &Advertisement, interfaces: &Interfaces) -> Result<Advertiser> {
        let info = service_info(ad, interfaces)?;
        let fullname = info.get_fullname().to_owned();
        let daemon = Mdns::start(interfaces)?;
        daemon.inner.register(info).map_err(mdns("registering the advertisement"))?;
        Ok(Advertiser { daemon, fullname })
    }

    /// Unregisters the advertisement (goodbye packets) and stops the mDNS
    /// daemon, waiting for both (milliseconds; at most a few seconds if
    /// its thread is stuck). Blocks: call it off the async runtime's
    /// worker threads, or accept a few milliseconds there.
    pub fn withdraw(self) -> Result<()> {
        let status =
            self.daemon.inner.unregister(&self.fullname).map_err(mdns("withdrawing the advertisement"))?.recv_timeout(REPLY_TIMEOUT);
        match status {
            Ok(UnregisterStatus::OK) => {}
            Ok(UnregisterStatus::NotFound) => {
                return Err(TrustError::Discovery(format!("withdrawing the advertisement: mDNS does not know {}", self.fullname)));
            }
            Err(e) => {
                return Err(TrustError::Discovery(format!("withdrawing the advertisement: no answer from mDNS: {e}")));
            }
        }
        self.daemon.stop()
    }
}

/// Browses for [`SERVICE_TYPE`] on `interfaces` until `done` returns true
/// or `wait` has passed, then stops and returns what was found: one entry
/// per device ID (the latest advertisement wins), without the ones
/// withdrawn meanwhile. `done` sees the list each time it changes.
///
/// Skipped, as useless or unsafe to show: advertisements without a valid
/// `id`, without a valid `name`, or without an IPv4 address.
pub async fn browse(interfaces: &Interfaces, wait: Duration, mut done: impl FnMut(&[Discovered]) -> bool) -> Result<Vec<Discovered>> {
    let deadline = tokio::time::Instant::now() + wait;
    let daemon = Mdns::start(interfaces)?;
    let events = daemon.inner.browse(SERVICE_TYPE).map_err(mdns("browsing"))?;
    let mut found = Found::default();
    loop {
        let event = match tokio::time::timeout_at(deadline, events.recv_async()).await {
            Ok(Ok(event)) => event,
            // The daemon ends a browse whose receiver falls too far behind.
            Ok(Err(_)) => return Err(TrustError::Discovery("the mDNS browse stopped".into())),
            Err(_) => break,
        };
        let changed = match event {
            ServiceEvent::ServiceResolved(service) => found.resolved(&service),
            ServiceEvent::ServiceRemoved(_, fullname) => found.removed(&fullname),
            _ => false,
        };
        if changed && done(&found.list) {
            break;
        }
    }
    // Dropping the daemon stops the browse and its thread.
    drop(daemon);
    Ok(found.list)
}

impl Interfaces {
    /// Every named interface exists (mdns-sd would use none, silently).
    fn check(&self) -> Result<()> {
        let Interfaces::Named(names) = self else {
            return Ok(());
        };
        if names.is_empty() {
            return Err(TrustError::Discovery("no network interface given".into()));
        }
        match names.iter().find(|name| !interface_exists(name)) {
            Some(name) => Err(TrustError::Discovery(format!("no network interface named {name:?}"))),
            None => Ok(()),
        }
    }

    /// Narrows a fresh daemon to these interfaces, IPv4 only. The last
    /// selection that matches an interface decides, so the order matters.
    fn restrict(&self, daemon: &ServiceDaemon) -> Result<()> {
        let restrict = || -> mdns_sd::Result<()> {
            match self {
                Interfaces::AllLan => daemon.disable_interface(vec![IfKind::LoopbackV4, IfKind::LoopbackV6, IfKind::IPv6]),
                Interfaces::Named(names) => {
                    daemon.disable_interface(IfKind::All)?;
                    let names = names.iter().cloned().map(IfKind::Name).collect::<Vec<_>>();
                    daemon.enable_interface(names)?;
                    daemon.disable_interface(IfKind::IPv6)
                }
            }
        };
        restrict().map_err(mdns("choosing the interfaces"))
    }

    /// Where an advertisement may take its addresses from.
    fn kinds(&self) -> Vec<IfKind> {
        match self {
            Interfaces::AllLan => vec![IfKind::IPv4],
            Interfaces::Named(names) => names.iter().cloned().map(IfKind::Name).collect(),
        }
    }
}

fn interface_exists(name: &str) -> bool {
    let Ok(name) = CString::new(name) else {
        return false;
    };
    // SAFETY: `name` is a NUL-terminated string that outlives the call,
    // which only reads it.
    unsafe { libc::if_nametoindex(name.as_ptr()) != 0 }
}

/// An mDNS daemon (mdns-sd runs it on a thread of its own), stopped when
/// dropped.
struct Mdns {
    inner: ServiceDaemon,
    stopped: bool,
}

impl Mdns {
    /// Checks the interfaces, then starts a daemon restricted to them.
    fn start(interfaces: &Interfaces) -> Result<Mdns> {
        interfaces.check()?;
        let inner = ServiceDaemon::new().map_err(mdns("starting mDNS"))?;
        let daemon = Mdns { inner, stopped: false };
        interfaces.restrict(&daemon.inner)?;
        Ok(daemon)
    }

    /// Stops the daemon (it sends goodbye packets for whatever it still
    /// advertises) and waits until it has.
    fn stop(mut self) -> Result<()> {
        self.stopped = true;
        let status = self.inner.shutdown().map_err(mdns("stopping mDNS"))?.recv_timeout(REPLY_TIMEOUT);
        match status {
            Ok(DaemonStatus::Shutdown) => Ok(()),
            Ok(other) => Err(TrustError::Discovery(format!("stopping mDNS: it answered {other:?}"))),
            Err(e) => Err(TrustError::Discovery(format!("stopping mDNS: no answer: {e}"))),
        }
    }
}

impl Drop for Mdns {
    fn drop(&mut self) {
        if !self.stopped {
            // Best effort: it fails only if the thread is gone already.
            let _ = self.inner.shutdown();
        }
    }
}

fn mdns(what: &'static str) -> impl FnOnce(mdns_sd::Error) -> TrustError {
    move |e| TrustError::Discovery(format!("{what}: {e}"))
}

/// The advertisement as mdns-sd registers it, checked; addresses are
/// filled in by the daemon from `interfaces`.
fn service_info(ad: &Advertisement, interfaces: &Interfaces) -> Result<ServiceInfo> {
    check_name(&ad.name)?;
    if ad.port == 0 {
        return Err(TrustError::Discovery("cannot advertise port 0; advertise the port the daemon listens on".into()));
    }
    if let Some(tier) = ad.tiers.iter().find(|t| t.is_empty() || t.contains(',')) {
        return Err(TrustError::Discovery(format!("cannot advertise the tier name {tier:?} (empty or contains a comma)")));
    }
    let txt = [
        (TXT_ID, ad.device_id.to_string()),
        (TXT_NAME, ad.name.clone()),
        (TXT_VERSION, ad.version.clone()),
        (TXT_TIERS, ad.tiers.join(",")),
    ];
    let mut info =
        ServiceInfo::new(SERVICE_TYPE, &instance_name(&ad.name), &mdns_host_name(&ad.name, &ad.device_id), (), ad.port, &txt[..])
            .map_err(mdns("the advertisement"))?
            .enable_addr_auto();
    info.set_interfaces(interfaces.kinds());
    Ok(info)
}

/// The DNS-SD instance name: the device name without the characters
/// mdns-sd's renaming trips on (`.`, `\`), cut to fit a label. Only a
/// handle: browsers read the real name from TXT.
fn instance_name(name: &str) -> String {
    let name: String = name.trim().chars().map(|c| if c == '.' || c == '\\' { '-' } else { c }).collect();
    truncate(&name, INSTANCE_MAX_BYTES).trim_end().to_owned()
}

/// The host name for the address records: `<name>-<id>.local.`, the name
/// reduced to lower-case ASCII letters, digits and single `-`, the ID part
/// the first characters of the device ID.
fn mdns_host_name(name: &str, id: &DeviceId) -> String {
    let mut label = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            label.push(c.to_ascii_lowercase());
        } else if !label.is_empty() && !label.ends_with('-') {
            label.push('-');
        }
    }
    let label = truncate(&label, HOST_NAME_MAX_BYTES).trim_end_matches('-');
    let label = if label.is_empty() { "revis" } else { label };
    let id: String =
        id.to_string().chars().filter(char::is_ascii_alphanumeric).take(HOST_ID_CHARS).map(|c| c.to_ascii_lowercase()).collect();
    format!("{label}-{id}.local.")
}

/// `s` cut to at most `max` bytes, at a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A resolved service as revis reads it, or None when it is not one it can
/// use (see [`browse`]).
fn decode(service: &ResolvedService) -> Option<Discovered> {
    let device_id = txt(service, TXT_ID)?.parse().ok()?;
    let name = txt(service, TXT_NAME)?;
    check_name(name).ok()?;
    let mut addresses: Vec<SocketAddr> =
        service.get_addresses_v4().into_iter().map(|ip| SocketAddr::new(IpAddr::V4(ip), service.get_port())).collect();
    if addresses.is_empty() {
        return None;
    }
    addresses.sort();
    Some(Discovered {
        name: name.to_owned(),
        device_id,
        addresses,
        version: txt(service, TXT_VERSION).unwrap_or_default().to_owned(),
        tiers: txt(service, TXT_TIERS).unwrap_or_default().split(',').filter(|t| !t.is_empty()).map(str::to_owned).collect(),
    })
}

/// A TXT value that is present and UTF-8.
fn txt<'a>(service: &'a ResolvedService, key: &str) -> Option<&'a str> {
    std::str::from_utf8(service.get_property_val(key)??).ok()
}

/// What a browse has found so far, with the DNS-SD name each came under
/// (a removal names only that).
#[derive(Default)]
struct Found {
    list: Vec<Discovered>,
    fullnames: Vec<String>,
}

impl Found {
    /// Takes in a resolution; true if the list changed.
    fn resolved(&mut self, service: &ResolvedService) -> bool {
        let Some(new) = decode(service) else {
            return false;
        };
        let fullname = service.get_fullname();
        if let Some(i) = self.position(fullname)
            && self.list[i] == new
        {
            return false;
        }
        self.retain(|d, name| d.device_id != new.device_id && !name.eq_ignore_ascii_case(fullname));
        self.list.push(new);
        self.fullnames.push(fullname.to_owned());
        true
    }

    /// Takes in a removal; true if the list changed.
    fn removed(&mut self, fullname: &str) -> bool {
        let before = self.list.len();
        self.retain(|_, name| !name.eq_ignore_ascii_case(fullname));
        self.list.len() != before
    }

    fn position(&self, fullname: &str) -> Option<usize> {
        self.fullnames.iter().position(|name| name.eq_ignore_ascii_case(fullname))
    }

    fn retain(&mut self, keep: impl Fn(&Discovered, &str) -> bool) {
        let mut i = 0;
        while i < self.list.len() {
            if keep(&self.list[i], &self.fullnames[i]) {
                i += 1;
            } else {
                self.list.remove(i);
                self.fullnames.remove(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! Pure logic only: no test here may start an mDNS daemon (it would
    //! multicast on this machine's real interfaces). The real thing runs in
    //! network namespaces, in `tests/e2e/discovery.rs`.

    use super::*;
    use crate::Identity;

    fn ad() -> Advertisement {
        Advertisement {
            name: "Kitchen Mac".into(),
            device_id: Identity::generate().unwrap().device_id(),
            port: 7443,
            version: "0.1.0".into(),
            tiers: vec!["fast".into(), "smart".into()],
        }
    }

    /// What a browser resolves from `info` announced with `addresses`.
    fn resolved(info: &ServiceInfo, addresses: &str) -> ResolvedService {
        let txt: Vec<(String, String)> = info.get_properties().iter().map(|p| (p.key().to_owned(), p.val_str().to_owned())).collect();
        ServiceInfo::new(
            SERVICE_TYPE,
            info.get_fullname().trim_end_matches(SERVICE_TYPE).trim_end_matches('.'),
            info.get_hostname(),
            addresses,
            info.get_port(),
            &txt[..],
        )
        .unwrap()
        .as_resolved_service()
    }

    fn with_txt(txt: &[(&str, &str)], addresses: &str) -> ResolvedService {
        ServiceInfo::new(SERVICE_TYPE, "x", "x.local.", addresses, 7443, txt).unwrap().as_resolved_service()
    }

    #[test]
    fn an_advertisement_reads_back_as_sent_with_ipv4_addresses_only() {
        let ad = ad();
        let info = service_info(&ad, &Interfaces::AllLan).unwrap();
        let found = decode(&resolved(&info, "10.0.0.7,fe80::1,192.168.1.2")).unwrap();
        assert_eq!(
            found,
            Discovered {
                name: ad.name.clone(),
                device_id: ad.device_id,
                addresses: vec!["10.0.0.7:7443".parse().unwrap(), "192.168.1.2:7443".parse().unwrap()],
                version: ad.version.clone(),
                tiers: ad.tiers.clone(),
            }
        );
        assert_eq!(decode(&resolved(&info, "fe80::1")), None, "no IPv4 address, nothing to dial");
    }

    #[test]
    fn advertisements_without_a_valid_id_or_name_are_skipped() {
        let id = Identity::generate().unwrap().device_id().to_string();
        let id = id.as_str();
        let ok = with_txt(&[("id", id), ("name", "a")], "10.0.0.1");
        let found = decode(&ok).unwrap();
        assert_eq!((found.version.as_str(), found.tiers.len()), ("", 0));
        for txt in [
            &[("name", "a")][..],
            &[("id", "ABCDEFG"), ("name", "a")],
            &[("id", id)],
            &[("id", id), ("name", "")],
            &[("id", id), ("name", "bell\u{7}")],
        ] {
            assert_eq!(decode(&with_txt(txt, "10.0.0.1")), None, "{txt:?}");
        }
    }

    #[test]
    fn what_cannot_be_advertised_is_refused_before_mdns_starts() {
        let check = |change: fn(&mut Advertisement), expect: expect_test::Expect| {
            let mut ad = ad();
            change(&mut ad);
            let err = service_info(&ad, &Interfaces::AllLan).unwrap_err();
            expect.assert_eq(&err.to_string());
        };
        check(|ad| ad.name = "x".repeat(65), expect_test::expect!["invalid device name: longer than 64 characters"]);
        check(|ad| ad.port = 0, expect_test::expect!["mDNS discovery: cannot advertise port 0; advertise the port the daemon listens on"]);
        check(
            |ad| ad.tiers = vec!["a,b".into()],
            expect_test::expect![[r#"mDNS discovery: cannot advertise the tier name "a,b" (empty or contains a comma)"#]],
        );
    }

    #[test]
    fn instance_and_host_names_fit_dns() {
        let id = DeviceId::from_bytes([0; 32]);
        let id8: String = id.to_string().replace('-', "")[..8].to_ascii_lowercase();
        let check = |name: &str, instance: &str, host: &str| {
            assert_eq!(instance_name(name), instance, "instance of {name:?}");
            assert_eq!(mdns_host_name(name, &id), format!("{host}-{id8}.local."), "host of {name:?}");
        };
        check("Kitchen Mac", "Kitchen Mac", "kitchen-mac");
        check("  a.b\\c  ", "a-b-c", "a-b-c");
        check("Büro — 2", "Büro — 2", "b-ro-2");
        check("日本", "日本", "revis");
        let long = "é".repeat(64);
        assert_eq!(instance_name(&long), "é".repeat(INSTANCE_MAX_BYTES / 2));
        assert!(mdns_host_name(&"x".repeat(64), &id).len() <= HOST_NAME_MAX_BYTES + 1 + HOST_ID_CHARS + 7);
    }

    #[test]
    fn named_interfaces_must_exist() {
        let check = |names: &[&str]| Interfaces::Named(names.iter().map(|n| n.to_string()).collect()).check().map_err(|e| e.to_string());
        // Every network namespace has a loopback interface.
        assert_eq!(check(&["lo"]), Ok(()));
        assert_eq!(check(&["lo", "veth9-nope"]), Err(r#"mDNS discovery: no network interface named "veth9-nope""#.into()));
        assert_eq!(check(&["a\0b"]), Err(r#"mDNS discovery: no network interface named "a\0b""#.into()));
        assert_eq!(check(&[]), Err("mDNS discovery: no network interface given".into()));
        assert_eq!(Interfaces::AllLan.check().map_err(|e| e.to_string()), Ok(()));
    }

    #[test]
    fn a_browse_keeps_one_entry_per_device_and_drops_withdrawn_ones() {
        let a = Identity::generate().unwrap().device_id().to_string();
        let b = Identity::generate().unwrap().device_id().to_string();
        let service = |instance: &str, id: &str, ip: &str| {
            ServiceInfo::new(SERVICE_TYPE, instance, "h.local.", ip, 7443, &[("id", id), ("name", instance)][..])
                .unwrap()
                .as_resolved_service()
        };
        let mut found = Found::default();
        let listed = |found: &Found| -> Vec<(String, String)> {
            found.list.iter().map(|d| (d.name.clone(), d.addresses[0].ip().to_string())).collect()
        };
        assert!(found.resolved(&service("one", &a, "10.0.0.1")));
        assert!(!found.resolved(&service("one", &a, "10.0.0.1")), "the same again changes nothing");
        assert!(found.resolved(&service("two", &b, "10.0.0.2")));
        // Device a again under another name: the latest wins.
        assert!(found.resolved(&service("uno", &a, "10.0.0.3")));
        assert_eq!(listed(&found), [("two".into(), "10.0.0.2".into()), ("uno".into(), "10.0.0.3".into())]);
        assert!(!found.removed("one._revis._tcp.local."), "already replaced");
        assert!(found.removed("TWO._revis._tcp.local."));
        assert_eq!(listed(&found), [("uno".into(), "10.0.0.3".into())]);
        assert!(!found.resolved(&with_txt(&[("name", "no id")], "10.0.0.4")));
    }
}
