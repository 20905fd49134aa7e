//! What every MCP server child process gets, whoever runs it (the bridge in a pod, the pool in
//! local mode): its own process group, so a stop reaches what it started (`npx` and `uvx` run the
//! real server as a grandchild), and a stderr reader that cannot be stopped or flooded by what
//! the server writes (lines are bounded, invalid UTF-8 is replaced, never an end of reading:
//! closing the pipe would kill a server that logs on with SIGPIPE).

use std::time::Duration;

use rustix::process::Signal;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};

/// How long a stopped server's process group gets between SIGTERM and SIGKILL. Package runners
/// (`npx`, `uvx`) clean up on SIGTERM; killed mid-download, npm leaves a broken cache behind
/// (`Cannot find module ...` on every later start).
pub(crate) const TERM_GRACE: Duration = Duration::from_secs(3);
/// Poll period while waiting for the rest of a group after its leader exited.
const GROUP_POLL: Duration = Duration::from_millis(50);
/// Bound on reaping after SIGKILL: a process that survives it is the kernel's problem.
const REAP_AFTER_KILL: Duration = Duration::from_secs(5);

/// Stops the process group `child` leads: SIGTERM to the group, then up to `grace` for the
/// group to be gone (the leader reaped, and whatever it started exited), then SIGKILL to what
/// is left. The leader is reaped; no zombie remains.
pub(crate) async fn terminate_group(child: &mut tokio::process::Child, grace: Duration) {
    let Some(pid) = child.id() else { return };
    if let Err(error) = signal_group(pid, Signal::TERM) {
        tracing::warn!(pid, %error, "cannot send SIGTERM to the MCP server's process group");
    }
    // A stopped (frozen) process acts on SIGTERM only once continued.
    let _ = signal_group(pid, Signal::CONT);
    let deadline = tokio::time::Instant::now() + grace;
    let leader_exited = tokio::time::timeout_at(deadline, child.wait()).await.is_ok();
    // The group id stays taken while any member lives, so it cannot name someone else's group.
    while leader_exited && group_alive(pid) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(GROUP_POLL).await;
    }
    if leader_exited && !group_alive(pid) {
        return;
    }
    tracing::warn!(pid, ?grace, "MCP server still running after SIGTERM; sending SIGKILL");
    if let Err(error) = signal_group(pid, Signal::KILL) {
        tracing::warn!(pid, %error, "cannot kill the MCP server's process group");
    }
    let _ = child.start_kill();
    let _ = tokio::time::timeout(REAP_AFTER_KILL, child.wait()).await;
}

/// A child leading its own process group, stopped with its group when dropped: a start
/// abandoned midway (its budget ran out, or the server was removed) must not leave `npx`'s
/// grandchildren behind, which `kill_on_drop` alone would (it kills only the leader). The stop
/// is [`terminate_group`] in the background; without a runtime, SIGKILL at once.
pub(crate) struct GroupGuard(Option<tokio::process::Child>);

impl GroupGuard {
    pub(crate) fn new(child: tokio::process::Child) -> Self {
        GroupGuard(Some(child))
    }

    /// The leader's pid, while it has not been reaped.
    pub(crate) fn id(&self) -> Option<u32> {
        self.0.as_ref().and_then(tokio::process::Child::id)
    }

    pub(crate) fn child_mut(&mut self) -> Option<&mut tokio::process::Child> {
        self.0.as_mut()
    }

    /// Stops the group now and waits for it ([`terminate_group`] with [`TERM_GRACE`]).
    pub(crate) async fn terminate(mut self) {
        if let Some(mut child) = self.0.take() {
            terminate_group(&mut child, TERM_GRACE).await;
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        let Some(mut child) = self.0.take() else { return };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move { terminate_group(&mut child, TERM_GRACE).await });
            }
            Err(_) => {
                if let Some(pid) = child.id()
                    && let Err(error) = signal_group(pid, Signal::KILL)
                {
                    tracing::warn!(pid, %error, "cannot kill the MCP server's process group");
                }
                let _ = child.start_kill();
            }
        }
    }
}

/// Whether any process of the group `pid` is left (a zombie leader counts until reaped).
fn group_alive(pid: u32) -> bool {
    let Some(pid) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) else { return false };
    rustix::process::test_kill_process_group(pid).is_ok()
}

/// Sends `signal` to the process group `pid` leads. ESRCH (already gone) is success.
pub(crate) fn signal_group(pid: u32, signal: Signal) -> Result<(), rustix::io::Errno> {
    let Some(pid) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) else {
        return Ok(());
    };
    match rustix::process::kill_process_group(pid, signal) {
        Err(rustix::io::Errno::SRCH) => Ok(()),
        other => other,
    }
}

/// Calls `each` with every line of `reader` (without its line end), each cut to `max_line`
/// bytes (the rest of a longer line comes as the next ones), invalid UTF-8 replaced. Returns at
/// end of input or on a read error.
pub(crate) async fn for_each_line(reader: impl AsyncRead + Unpin, max_line: usize, mut each: impl FnMut(&str)) {
    let mut reader = BufReader::new(reader);
    let mut line = Vec::with_capacity(256);
    // The previous piece was cut at `max_line`: a lone line end now only ends it.
    let mut cut = false;
    loop {
        line.clear();
        match (&mut reader).take(max_line as u64).read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let ended = line.last() == Some(&b'\n');
                if !(cut && line == b"\n") {
                    let text = String::from_utf8_lossy(&line);
                    each(text.trim_end_matches(['\n', '\r']));
                }
                cut = !ended;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_bounded_and_invalid_utf8_does_not_stop_the_reader() {
        let input: Vec<u8> = [b"ok\n".as_slice(), b"\xff\xfe bad\n", &[b'x'; 10], b"\nlast\n"].concat();
        let mut seen = Vec::new();
        for_each_line(input.as_slice(), 4, |l| seen.push(l.to_string())).await;
        assert_eq!(seen, ["ok", "\u{fffd}\u{fffd} b", "ad", "xxxx", "xxxx", "xx", "last"]);
    }
}
