//! systemd's unit files as templates: each service's units, in the order
//! they need each other, with `{{EXEC}}` and `{{ENVIRONMENT}}` to fill in.

/// One unit file: its name, and its text with `{{EXEC}}` (the ExecStart
/// command line) and `{{ENVIRONMENT}}` (`Environment=` lines) to fill in.
#[derive(Debug)]
pub struct Unit {
    pub name: &'static str,
    pub(crate) template: &'static str,
}

pub(crate) const REVISD_UNITS: &[Unit] =
    &[Unit { name: "revisd.socket", template: REVISD_SOCKET }, Unit { name: "revisd.service", template: REVISD_SERVICE }];
pub(crate) const SERVE_UNITS: &[Unit] = &[Unit { name: "revis-serve.service", template: SERVE_SERVICE }];

/// `%t` is the user's runtime directory, so the path is
/// `$XDG_RUNTIME_DIR/revis/revisd.sock`, the clients' default; systemd
/// creates the directory 0700 and the socket 0600, like revisd itself.
const REVISD_SOCKET: &str = "\
# The socket of revisd, the revis inference daemon. systemd holds it from
# login on and hands it to revisd (socket activation); a connection starts
# revisd when it is not running.
# Written by `revisd service install`, which rewrites it.
[Unit]
Description=revis inference daemon socket

[Socket]
ListenStream=%t/revis/revisd.sock
SocketMode=0600
DirectoryMode=0700
RemoveOnStop=yes

[Install]
WantedBy=sockets.target
";

const REVISD_SERVICE: &str = "\
# revisd, the revis inference daemon, as a systemd user service.
# Written by `revisd service install`, which rewrites it: put settings of
# your own in `systemctl --user edit revisd.service`.
[Unit]
Description=revis inference daemon
Requires=revisd.socket
After=revisd.socket

[Service]
Type=simple
ExecStart={{EXEC}}
{{ENVIRONMENT}}\
# Started again when it crashes or is killed, not after a clean stop. A bad
# config (exit 64) or an unusable socket (exit 73) would fail again: not retried.
Restart=on-failure
RestartSec=2
RestartPreventExitStatus=64 73
# After SIGTERM revisd drains and exits within 5 s (2 s grace, then 3 s).
TimeoutStopSec=15

[Install]
WantedBy=default.target
Also=revisd.socket
";

/// Wants=, not Requires=: without revisd's units (a revisd of its own,
/// `--socket`, `--node`) it runs all the same.
const SERVE_SERVICE: &str = "\
# revis serve, OpenAI's and Ollama's HTTP APIs over revis, as a systemd user
# service. Written by `revis serve install`, which rewrites it: put settings
# of your own in `systemctl --user edit revis-serve.service`.
[Unit]
Description=revis serve (OpenAI- and Ollama-compatible HTTP APIs)
# It answers through revisd: installed as a service too (`revisd service
# install`), revisd is started by the first request on its socket.
Wants=revisd.socket
After=revisd.socket

[Service]
Type=simple
ExecStart={{EXEC}}
{{ENVIRONMENT}}\
# Started again when it crashes or is killed, not after a clean stop. A bad
# command line (exit 2) or bad flags (exit 64) would fail again: not retried.
Restart=on-failure
RestartSec=2
RestartPreventExitStatus=2 64
# After SIGTERM answers under way get 3 s to end.
TimeoutStopSec=15

[Install]
WantedBy=default.target
";
