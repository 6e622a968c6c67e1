//! Child processes revisd starts (the RPC worker, split engines) end with
//! it, even when it is killed: the child's stdin is a pipe whose only write
//! end revisd holds, and the child exits when it reads end-of-file there.
//! (Linux's `PR_SET_PDEATHSIG` would follow the thread that forked, which
//! tokio's blocking pool retires after a while; and macOS has none.)

use std::io::Read;
use std::process::{Command, Stdio};

/// Gives `cmd` a stdin pipe; keep the `Child` (its stdin) for as long as
/// the child should live.
pub fn die_with_parent(cmd: &mut Command) {
    cmd.stdin(Stdio::piped());
}

/// In the child: exits the process once the parent is gone (stdin at EOF).
pub fn exit_with_parent() {
    std::thread::Builder::new()
        .name("revis-parent-watch".into())
        .spawn(|| {
            let mut sink = [0u8; 64];
            let mut stdin = std::io::stdin();
            while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
            std::process::exit(0);
        })
        .expect("start the parent watch thread");
}
