//! Running the manager's commands (launchctl, systemctl) and writing the
//! report's lines: shared by both managers.

use crate::error::ServiceError;

/// Prints a line of the report; a closed stdout is no reason to stop halfway.
macro_rules! say {
    ($out:expr, $($arg:tt)*) => {{ let _ = writeln!($out, $($arg)*); }};
}
pub(crate) use say;

/// `a`, `a and b`, `a, b and c`.
pub(crate) fn and_list<S: AsRef<str>>(items: &[S]) -> String {
    match items {
        [] => String::new(),
        [one] => one.as_ref().to_owned(),
        [rest @ .., last] => format!("{} and {}", rest.iter().map(AsRef::as_ref).collect::<Vec<_>>().join(", "), last.as_ref()),
    }
}

/// The output of a manager command, or why it could not run.
pub(crate) fn run(program: &str, args: &[&str]) -> Result<std::process::Output, ServiceError> {
    let command = || std::iter::once(program).chain(args.iter().copied()).collect::<Vec<_>>().join(" ");
    std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| ServiceError::Command { command: command(), message: e.to_string() })
}

/// Fails with the command's own words unless it succeeded.
pub(crate) fn check(program: &str, args: &[&str], output: std::process::Output) -> Result<std::process::Output, ServiceError> {
    if output.status.success() {
        return Ok(output);
    }
    let command = std::iter::once(program).chain(args.iter().copied()).collect::<Vec<_>>().join(" ");
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
    let message = if stderr.is_empty() { output.status.to_string() } else { stderr };
    Err(ServiceError::Command { command, message })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_read_as_english() {
        assert_eq!(and_list(&["a"]), "a");
        assert_eq!(and_list(&["a", "b"]), "a and b");
        assert_eq!(and_list(&["a", "b", "c"]), "a, b and c");
    }
}
