//! Pairing: a single-use code in a short window, SPAKE2 over it, bound to the TLS connection by its exporter.
//!
//! The server (the daemon host) opens a [`PairingWindow`] and shows its
//! [`PairingCode`]. The client connects with [`crate::pairing_client_config`]
//! (the server with [`crate::pairing_server_config`]): TLS 1.3, both sides
//! present their identity, nothing is pinned yet. Then, over that connection:
//!
//! 1. client → server `Hello`: protocol version, the client's name, SPAKE2
//!    message A (identities: A = client device ID, B = server device ID, the
//!    device IDs each side saw in the handshake; password: the code).
//! 2. server → client `Spake`: SPAKE2 message B (or `Refuse` when the window
//!    is closed).
//! 3. client → server `Tag`: HMAC-SHA256 under the SPAKE2 key over the
//!    transcript (a label, the side, the TLS exporter value, both device IDs,
//!    the client's name).
//! 4. server → client `Tag` (its own), or `Refuse` when the client's did not
//!    verify.
//! 5. client → server `Done` once the server's tag verified.
//! 6. server stores the client, then → client `Paired`; the client stores
//!    the server.
//!
//! A window takes [`MAX_ATTEMPTS_PER_ADDRESS`] wrong codes from one source
//! address (an IPv4 address, an IPv6 /64, a link-local IPv6 address) and [`MAX_ATTEMPTS`] in all: a
//! stranger who can reach the port locks out only itself, and the owner's
//! own attempt still goes through, while online guessing stays at ten tries
//! against an 8-digit code. Closing the window ([`PairingWindow::close`])
//! refuses attempts already under way too: a code shown no longer pairs.
//!
//! A relay that terminates TLS on both sides sees different exporter values
//! and presents its own device ID to each side, so the tags cannot match:
//! both sides fail and nothing is stored. Messages are length-prefixed
//! (u32, big-endian) and at most [`MAX_FRAME`] bytes; anything malformed is a
//! [`TrustError::Protocol`], never a panic.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use rand::Rng;
use rustls::ConnectionCommon;
use sha2::Sha256;
use spake2::{Ed25519Group, Spake2};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::store::check_name;
use crate::{DeviceId, Result, TrustError, TrustStore, peer_device_id};

/// How long a window stays open unless told otherwise.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(120);
/// Wrong codes a window takes in all before it closes for good.
pub const MAX_ATTEMPTS: u32 = 10;
/// Wrong codes a window takes from one source address (IPv4 address, IPv6
/// /64, link-local IPv6 address) before it refuses that address.
pub const MAX_ATTEMPTS_PER_ADDRESS: u32 = 3;
/// Digits in a code the server shows.
pub const CODE_DIGITS: usize = 8;
/// Digits a code the user types may have.
const CODE_DIGITS_ACCEPTED: std::ops::RangeInclusive<usize> = 6..=8;
/// Largest pairing message (payload, without the length prefix).
pub const MAX_FRAME: usize = 1024;
/// The label of the TLS exporter value the tags cover.
pub const EXPORTER_LABEL: &[u8] = b"EXPORTER-revis-pairing-v1";
/// The version of this protocol, sent in `Hello`.
const VERSION: u8 = 1;
/// The label that opens every tag's transcript.
const TRANSCRIPT_LABEL: &[u8] = b"revis pairing v1 key confirmation";
/// Longest name a client may send (bytes; the store checks it further).
const MAX_NAME_BYTES: usize = 256;

const HELLO: u8 = 1;
const SPAKE: u8 = 2;
const TAG: u8 = 3;
const DONE: u8 = 4;
const REFUSE: u8 = 5;
const PAIRED: u8 = 6;

const REFUSE_WRONG_CODE: u8 = 1;
const REFUSE_WINDOW_CLOSED: u8 = 2;
const REFUSE_TOO_MANY: u8 = 3;
const REFUSE_PROTOCOL: u8 = 4;
const REFUSE_STORE: u8 = 5;

type HmacSha256 = Hmac<Sha256>;

/// A pairing code: decimal digits from a CSPRNG. Its `Debug` hides it.
#[derive(Clone, PartialEq, Eq)]
pub struct PairingCode(String);

impl PairingCode {
    /// A fresh random code of [`CODE_DIGITS`] digits.
    pub fn generate() -> Self {
        let max = 10u64.pow(CODE_DIGITS as u32);
        let n = rand::rng().random_range(0..max);
        Self(format!("{n:0width$}", width = CODE_DIGITS))
    }

    /// The digits, without separators.
    pub fn digits(&self) -> &str {
        &self.0
    }
}

/// Groups of four digits, `1234 5678`, the way it is shown to the user.
impl fmt::Display for PairingCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (head, tail) = self.0.split_at(self.0.len() / 2);
        write!(f, "{head} {tail}")
    }
}

impl fmt::Debug for PairingCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PairingCode(..)")
    }
}

/// Parses what the user typed: 6 to 8 digits; spaces and `-` are ignored.
impl FromStr for PairingCode {
    type Err = TrustError;

    fn from_str(s: &str) -> Result<Self> {
        let digits: String = s.chars().filter(|c| !matches!(c, ' ' | '-')).collect();
        if !digits.chars().all(|c| c.is_ascii_digit()) || !CODE_DIGITS_ACCEPTED.contains(&digits.len()) {
            return Err(TrustError::Protocol("a pairing code is 6 to 8 digits".into()));
        }
        Ok(Self(digits))
    }
}

/// Wrong (or abandoned) attempts, and attempts under way: each counts
/// against the limits until it ends, so parallel connections cannot try
/// more codes than the limits.
#[derive(Clone, Copy, Debug, Default)]
struct Tries {
    failed: u32,
    in_flight: u32,
}

impl Tries {
    /// Whether another try would exceed `max`; `Some(true)` when the failed
    /// ones alone reach it.
    fn full(self, max: u32) -> Option<bool> {
        if self.failed >= max {
            Some(true)
        } else if self.failed + self.in_flight >= max {
            Some(false)
        } else {
            None
        }
    }
}

#[derive(Debug, Default)]
struct WindowState {
    /// From every address.
    all: Tries,
    /// By source (see [`source`]).
    by_source: HashMap<IpAddr, Tries>,
    /// A pairing succeeded: the code is spent.
    used: bool,
    /// Whoever opened the window closed it (or replaced it).
    closed: bool,
}

/// What failures are counted by: an IPv4 address, or an IPv6 address's /64
/// (one host may hold a whole /64), except a link-local one (fe80::/10),
/// counted by itself: every link-local peer shares the one fe80::/64, so a
/// stranger there would lock out the owner too.
fn source(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None if v6.is_unicast_link_local() => ip,
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
    }
}

/// The server's pairing window: one code, open until `deadline`, closed for
/// good after one success, [`MAX_ATTEMPTS`] wrong codes or
/// [`PairingWindow::close`]; an address that sent
/// [`MAX_ATTEMPTS_PER_ADDRESS`] wrong codes is refused. Shared by
/// reference between the connections that try it. Time is passed in
/// (`now`), so tests need no clock.
#[derive(Debug)]
pub struct PairingWindow {
    code: PairingCode,
    deadline: Instant,
    state: Mutex<WindowState>,
}

/// Why a window does not take an attempt now (from `from`, when given).
fn refusal(state: &WindowState, deadline: Instant, now: Instant, from: Option<IpAddr>) -> Option<TrustError> {
    let here = from.map(|ip| state.by_source.get(&source(ip)).copied().unwrap_or_default());
    if state.all.full(MAX_ATTEMPTS) == Some(true) {
        Some(TrustError::TooManyAttempts)
    } else if state.used || state.closed || now >= deadline {
        Some(TrustError::WindowClosed)
    } else if state.all.full(MAX_ATTEMPTS).is_some() || here.is_some_and(|t| t.full(MAX_ATTEMPTS_PER_ADDRESS).is_some()) {
        // Every remaining try (of this address) is spent or taken by a
        // connection under way.
        Some(TrustError::TooManyAttempts)
    } else {
        None
    }
}

impl PairingWindow {
    /// Opens a window at `now` for `duration` with a fresh code.
    pub fn open(now: Instant, duration: Duration) -> Self {
        Self::with_code(PairingCode::generate(), now, duration)
    }

    /// Opens a window with a given code (tests).
    pub fn with_code(code: PairingCode, now: Instant, duration: Duration) -> Self {
        Self { code, deadline: now + duration, state: Mutex::new(WindowState::default()) }
    }

    /// The code to show.
    pub fn code(&self) -> &PairingCode {
        &self.code
    }

    /// When the window closes.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Whether an attempt starting at `now` would be taken from an address
    /// that has not tried yet.
    pub fn is_open(&self, now: Instant) -> bool {
        refusal(&self.lock(), self.deadline, now, None).is_none()
    }

    /// Wrong codes so far, from every address.
    pub fn failed_attempts(&self) -> u32 {
        self.lock().all.failed
    }

    /// Wrong codes so far from `from`'s source (see [`MAX_ATTEMPTS_PER_ADDRESS`]).
    pub fn failed_attempts_from(&self, from: IpAddr) -> u32 {
        self.lock().by_source.get(&source(from)).map_or(0, |t| t.failed)
    }

    /// Closes the window for good: no attempt starts, and none under way
    /// pairs, even with the right code.
    pub fn close(&self) {
        self.lock().closed = true;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, WindowState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts an attempt from `from` at `now`, or says why not.
    fn begin(&self, now: Instant, from: IpAddr) -> Result<Attempt<'_>> {
        let mut state = self.lock();
        if let Some(e) = refusal(&state, self.deadline, now, Some(from)) {
            return Err(e);
        }
        state.all.in_flight += 1;
        state.by_source.entry(source(from)).or_default().in_flight += 1;
        Ok(Attempt { window: self, source: source(from), ended: false })
    }
}

/// One attempt under way. Dropped without [`Attempt::succeed`] (a wrong
/// code, a broken connection, a protocol error), it counts as a wrong code.
struct Attempt<'a> {
    window: &'a PairingWindow,
    source: IpAddr,
    ended: bool,
}

impl Attempt<'_> {
    /// Ends the attempt: no longer under way, failed or not.
    fn end(&mut self, state: &mut WindowState, failed: bool) {
        self.ended = true;
        for tries in [&mut state.all, state.by_source.entry(self.source).or_default()] {
            tries.in_flight -= 1;
            tries.failed += u32::from(failed);
        }
    }

    /// Spends the code; fails when another attempt spent it first or the
    /// window was closed meanwhile.
    fn succeed(mut self) -> Result<()> {
        let window = self.window;
        let mut state = window.lock();
        self.end(&mut state, false);
        if state.used || state.closed {
            return Err(TrustError::WindowClosed);
        }
        state.used = true;
        Ok(())
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if !self.ended {
            let window = self.window;
            let mut state = window.lock();
            self.end(&mut state, true);
        }
    }
}

/// Where the server side of a pairing stores the device it paired: a
/// [`TrustStore`] borrowed for the whole exchange, or one behind a mutex
/// that is locked only to store (so a slow peer does not hold it).
pub trait PairingSink {
    fn pair(&mut self, id: DeviceId, name: &str) -> Result<()>;
}

impl PairingSink for &mut TrustStore {
    fn pair(&mut self, id: DeviceId, name: &str) -> Result<()> {
        self.add(id, name)
    }
}

impl PairingSink for &Mutex<TrustStore> {
    fn pair(&mut self, id: DeviceId, name: &str) -> Result<()> {
        self.lock().unwrap_or_else(|e| e.into_inner()).add(id, name)
    }
}

/// What both sides must agree on: this connection (its exporter value) and
/// the two device IDs each saw in the TLS handshake.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ChannelBinding {
    /// The TLS exporter value for [`EXPORTER_LABEL`], 32 bytes.
    pub exporter: [u8; 32],
    /// The client's device ID (SPAKE2 side A).
    pub client: DeviceId,
    /// The server's device ID (SPAKE2 side B).
    pub server: DeviceId,
}

impl fmt::Debug for ChannelBinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChannelBinding").field("client", &self.client).field("server", &self.server).finish_non_exhaustive()
    }
}

impl ChannelBinding {
    /// The binding of an established connection; `local` is this node's
    /// device ID, the peer's comes from its certificate.
    pub fn of_connection<D>(conn: &ConnectionCommon<D>, local: DeviceId, is_server: bool) -> Result<Self> {
        let peer = peer_device_id(conn).ok_or_else(|| TrustError::Protocol("the peer presented no certificate".into()))?;
        let exporter = conn.export_keying_material([0u8; 32], EXPORTER_LABEL, None)?;
        let (client, server) = if is_server { (peer, local) } else { (local, peer) };
        Ok(Self { exporter, client, server })
    }
}

/// The server's side of a pairing over a TLS stream from
/// [`crate::pairing_server_config`]: `local` is the server's device ID,
/// `from` the client's address (failures are counted by it). On success the
/// client is in `store` and its device ID is returned.
///
/// `now` is when the attempt starts; one that starts before the deadline
/// may finish after it. There is no timeout here: wrap the call in one. A
/// dropped (timed out) call after the client's SPAKE2 message counts as a
/// wrong code, so a stalled peer cannot hold a try forever.
pub async fn pair_server<S>(
    tls: &mut tokio_rustls::server::TlsStream<S>,
    local: DeviceId,
    window: &PairingWindow,
    from: IpAddr,
    store: impl PairingSink,
    now: Instant,
) -> Result<DeviceId>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let binding = ChannelBinding::of_connection(tls.get_ref().1, local, true)?;
    pair_server_over(tls, &binding, window, from, store, now).await
}

/// The client's side of a pairing over a TLS stream from
/// [`crate::pairing_client_config`]: `local` is the client's device ID,
/// `my_name` the name the server will list it under, `server_name` the name
/// to list the server under here. On success the server is in `store` and
/// its device ID is returned.
pub async fn pair_client<S>(
    tls: &mut tokio_rustls::client::TlsStream<S>,
    local: DeviceId,
    code: &PairingCode,
    my_name: &str,
    server_name: &str,
    store: &mut TrustStore,
) -> Result<DeviceId>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let binding = ChannelBinding::of_connection(tls.get_ref().1, local, false)?;
    pair_client_over(tls, &binding, code, my_name, server_name, store).await
}

/// [`pair_server`] over any byte stream, given the binding of the
/// connection it runs on.
pub async fn pair_server_over<S>(
    io: &mut S,
    binding: &ChannelBinding,
    window: &PairingWindow,
    from: IpAddr,
    mut store: impl PairingSink,
    now: Instant,
) -> Result<DeviceId>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (name, msg_a) = match read_frame(io).await.and_then(|h| parse_hello(&h)) {
        Ok(hello) => hello,
        Err(e) => {
            refuse(io, &e).await;
            return Err(e);
        }
    };
    let attempt = match window.begin(now, from) {
        Ok(attempt) => attempt,
        Err(e) => {
            refuse(io, &e).await;
            return Err(e);
        }
    };
    let result = server_exchange(io, binding, window, name, msg_a).await;
    match result {
        Ok(name) => {
            if let Err(e) = attempt.succeed() {
                refuse(io, &e).await;
                return Err(e);
            }
            if let Err(e) = store.pair(binding.client, &name) {
                send_frame(io, &[REFUSE, REFUSE_STORE]).await.ok();
                return Err(e);
            }
            send_frame(io, &[PAIRED]).await?;
            io.flush().await.map_err(TrustError::Connection)?;
            Ok(binding.client)
        }
        Err(e) => {
            drop(attempt);
            // After this failure the window may be locked (for everyone,
            // or for this address): say so.
            let e = match e {
                TrustError::WrongCode
                    if window.failed_attempts() >= MAX_ATTEMPTS || window.failed_attempts_from(from) >= MAX_ATTEMPTS_PER_ADDRESS =>
                {
                    TrustError::TooManyAttempts
                }
                e => e,
            };
            refuse(io, &e).await;
            Err(e)
        }
    }
}

/// Steps 2 to 5 for the server; the client's name when both tags verified
/// and the client confirmed.
async fn server_exchange<S>(io: &mut S, binding: &ChannelBinding, window: &PairingWindow, name: String, msg_a: Vec<u8>) -> Result<String>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (spake, msg_b) = Spake2::<Ed25519Group>::start_b(
        &spake2::Password::new(window.code.digits().as_bytes()),
        &spake2::Identity::new(binding.client.as_bytes()),
        &spake2::Identity::new(binding.server.as_bytes()),
    );
    let mut frame = vec![SPAKE];
    frame.extend_from_slice(&msg_b);
    send_frame(io, &frame).await?;
    let key = spake.finish(&msg_a).map_err(|e| TrustError::Protocol(format!("bad SPAKE2 message: {e:?}")))?;
    let client_tag = expect(read_frame(io).await?, TAG, 32, "the client's tag")?;
    verify_tag(&key, Side::Client, binding, &name, &client_tag)?;
    let mut frame = vec![TAG];
    frame.extend_from_slice(&tag(&key, Side::Server, binding, &name));
    send_frame(io, &frame).await?;
    expect(read_frame(io).await?, DONE, 0, "the client's confirmation")?;
    Ok(name)
}

/// [`pair_client`] over any byte stream, given the binding of the
/// connection it runs on.
pub async fn pair_client_over<S>(
    io: &mut S,
    binding: &ChannelBinding,
    code: &PairingCode,
    my_name: &str,
    server_name: &str,
    store: &mut TrustStore,
) -> Result<DeviceId>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    // Both names are checked before the code is spent, not after.
    check_name(my_name)?;
    check_name(server_name)?;
    if my_name.len() > MAX_NAME_BYTES {
        return Err(TrustError::InvalidName("longer than 256 bytes"));
    }
    let (spake, msg_a) = Spake2::<Ed25519Group>::start_a(
        &spake2::Password::new(code.digits().as_bytes()),
        &spake2::Identity::new(binding.client.as_bytes()),
        &spake2::Identity::new(binding.server.as_bytes()),
    );
    let mut hello = vec![HELLO, VERSION];
    let name_len = u16::try_from(my_name.len()).expect("bounded by MAX_NAME_BYTES");
    hello.extend_from_slice(&name_len.to_be_bytes());
    hello.extend_from_slice(my_name.as_bytes());
    hello.extend_from_slice(&msg_a);
    send_frame(io, &hello).await?;

    let msg_b = expect(read_frame(io).await?, SPAKE, 33, "the server's SPAKE2 message")?;
    let key = spake.finish(&msg_b).map_err(|e| TrustError::Protocol(format!("bad SPAKE2 message: {e:?}")))?;
    let mut frame = vec![TAG];
    frame.extend_from_slice(&tag(&key, Side::Client, binding, my_name));
    send_frame(io, &frame).await?;

    let server_tag = expect(read_frame(io).await?, TAG, 32, "the server's tag")?;
    verify_tag(&key, Side::Server, binding, my_name, &server_tag)?;
    send_frame(io, &[DONE]).await?;
    expect(read_frame(io).await?, PAIRED, 0, "the server's confirmation")?;
    store.add(binding.server, server_name)?;
    Ok(binding.server)
}

#[derive(Clone, Copy)]
enum Side {
    Client,
    Server,
}

/// HMAC-SHA256 under the SPAKE2 key over the transcript, for `side`.
fn tag(key: &[u8], side: Side, binding: &ChannelBinding, name: &str) -> [u8; 32] {
    transcript_mac(key, side, binding, name).finalize().into_bytes().into()
}

fn verify_tag(key: &[u8], side: Side, binding: &ChannelBinding, name: &str, tag: &[u8]) -> Result<()> {
    transcript_mac(key, side, binding, name).verify_slice(tag).map_err(|_| TrustError::WrongCode)
}

fn transcript_mac(key: &[u8], side: Side, binding: &ChannelBinding, name: &str) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(TRANSCRIPT_LABEL);
    mac.update(match side {
        Side::Client => b"client",
        Side::Server => b"server",
    });
    mac.update(&binding.exporter);
    mac.update(binding.client.as_bytes());
    mac.update(binding.server.as_bytes());
    mac.update(&(name.len() as u64).to_be_bytes());
    mac.update(name.as_bytes());
    mac
}

/// `Hello`: type, version, name length (u16), name (UTF-8), SPAKE2 message A.
fn parse_hello(frame: &[u8]) -> Result<(String, Vec<u8>)> {
    let rest = match frame {
        [] => return Err(TrustError::Protocol("empty message".into())),
        [HELLO, rest @ ..] => rest,
        [t, ..] => {
            return Err(TrustError::Protocol(format!("expected the client's hello, got message type {t}")));
        }
    };
    let [version, l0, l1, rest @ ..] = rest else {
        return Err(TrustError::Protocol("truncated hello".into()));
    };
    if *version != VERSION {
        return Err(TrustError::Protocol(format!("pairing protocol version {version} (this revis speaks {VERSION})")));
    }
    let len = usize::from(u16::from_be_bytes([*l0, *l1]));
    if len > MAX_NAME_BYTES || len > rest.len() {
        return Err(TrustError::Protocol("bad name length in hello".into()));
    }
    let (name, msg_a) = rest.split_at(len);
    let name = std::str::from_utf8(name).map_err(|_| TrustError::Protocol("the client's name is not UTF-8".into()))?;
    check_name(name).map_err(|e| TrustError::Protocol(format!("the client's name is not usable: {e}")))?;
    if msg_a.len() != 33 {
        return Err(TrustError::Protocol(format!("SPAKE2 message of {} bytes (expected 33)", msg_a.len())));
    }
    Ok((name.to_owned(), msg_a.to_vec()))
}

/// Checks a frame's type and body length; a `Refuse` becomes its error.
fn expect(frame: Vec<u8>, kind: u8, len: usize, what: &str) -> Result<Vec<u8>> {
    match frame.split_first() {
        Some((&k, body)) if k == kind && body.len() == len => Ok(body.to_vec()),
        Some((&REFUSE, [reason])) => Err(match *reason {
            REFUSE_WRONG_CODE => TrustError::WrongCode,
            REFUSE_WINDOW_CLOSED => TrustError::WindowClosed,
            REFUSE_TOO_MANY => TrustError::TooManyAttempts,
            REFUSE_STORE => TrustError::Protocol("the peer could not store the pairing".into()),
            _ => TrustError::Protocol("the peer refused: protocol error".into()),
        }),
        Some((&k, body)) if k == kind => Err(TrustError::Protocol(format!("{what}: {} bytes (expected {len})", body.len()))),
        Some((k, _)) => Err(TrustError::Protocol(format!("expected {what}, got message type {k}"))),
        None => Err(TrustError::Protocol(format!("expected {what}, got an empty message"))),
    }
}

/// Tells the client why (best effort: it may be gone already).
async fn refuse<S: AsyncWrite + Unpin>(io: &mut S, e: &TrustError) {
    let reason = match e {
        TrustError::WrongCode => REFUSE_WRONG_CODE,
        TrustError::WindowClosed => REFUSE_WINDOW_CLOSED,
        TrustError::TooManyAttempts => REFUSE_TOO_MANY,
        TrustError::Connection(_) => return,
        _ => REFUSE_PROTOCOL,
    };
    if send_frame(io, &[REFUSE, reason]).await.is_ok() {
        io.flush().await.ok();
    }
}

/// Writes one frame: u32 big-endian length, then the payload.
pub async fn send_frame<S: AsyncWrite + Unpin>(io: &mut S, payload: &[u8]) -> Result<()> {
    if payload.len() > MAX_FRAME {
        return Err(TrustError::Protocol(format!("message of {} bytes exceeds the limit of {MAX_FRAME}", payload.len())));
    }
    let len = u32::try_from(payload.len()).expect("bounded by MAX_FRAME");
    let mut buf = Vec::with_capacity(4 + payload.len());
    buf.extend_from_slice(&len.to_be_bytes());
    buf.extend_from_slice(payload);
    io.write_all(&buf).await.map_err(TrustError::Connection)?;
    io.flush().await.map_err(TrustError::Connection)
}

/// Reads one frame; a length over [`MAX_FRAME`] is refused before anything
/// is allocated, and a stream that ends early is a protocol error.
pub async fn read_frame<S: AsyncRead + Unpin>(io: &mut S) -> Result<Vec<u8>> {
    let mut len = [0u8; 4];
    io.read_exact(&mut len).await.map_err(eof_is_protocol)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(TrustError::Protocol(format!("message of {len} bytes exceeds the limit of {MAX_FRAME}")));
    }
    let mut buf = vec![0u8; len];
    io.read_exact(&mut buf).await.map_err(eof_is_protocol)?;
    Ok(buf)
}

fn eof_is_protocol(e: std::io::Error) -> TrustError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        TrustError::Protocol("the peer closed the connection mid-pairing".into())
    } else {
        TrustError::Connection(e)
    }
}
