//! Processes of the suite: the benchmark binaries it runs to completion (with a time cap
//! and a spinner), the servers it starts on loopback (stopped by PID, also on an error
//! path), the Debian packages it installs when missing, and free ports.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::progress;

/// A port nobody listens on right now (the OS picks it; the listener is closed at once).
pub fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("binding a free port")?;
    Ok(listener.local_addr()?.port())
}

/// `cmd` as one would type it in a shell, for the reports.
pub fn command_line(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| shell_quote(&a.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(" ")
}

fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@+".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Runs `cmd` to completion within `cap`, its stdout and stderr in files under `logs`
/// named after `name`, and parses its stdout as one JSON value.
pub fn run_json(
    cmd: &mut Command,
    name: &str,
    cap: Duration,
    logs: &Path,
) -> Result<serde_json::Value> {
    let out_path = logs.join(format!("{name}.out"));
    let err_path = logs.join(format!("{name}.err"));
    cmd.stdin(Stdio::null())
        .stdout(
            File::create(&out_path).with_context(|| format!("creating {}", out_path.display()))?,
        )
        .stderr(
            File::create(&err_path).with_context(|| format!("creating {}", err_path.display()))?,
        );
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", command_line(cmd)))?;
    let spinner = progress::spinner(name);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if started.elapsed() > cap {
            let _ = child.kill();
            let _ = child.wait();
            spinner.finish_and_clear();
            bail!("{name} did not finish within {cap:?} (cap); killed");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    spinner.finish_and_clear();
    let stdout = std::fs::read_to_string(&out_path)
        .with_context(|| format!("reading {}", out_path.display()))?;
    if !status.success() {
        let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
        bail!("{name} failed ({status}): {}", tail(&stderr, 20));
    }
    serde_json::from_str(&stdout)
        .with_context(|| format!("{name} printed no JSON: {}", tail(&stdout, 10)))
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Runs `cmd` to completion and fails with its output when it fails.
pub fn run_quiet(cmd: &mut Command) -> Result<()> {
    let line = command_line(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("starting {line}"))?;
    if !out.status.success() {
        bail!(
            "{line} failed ({}): {}{}",
            out.status,
            tail(&String::from_utf8_lossy(&out.stdout), 10),
            tail(&String::from_utf8_lossy(&out.stderr), 10)
        );
    }
    Ok(())
}

/// Whether this process runs as root (from /proc, no libc).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// `name` on the PATH, if any.
pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// Installs the Debian packages of `wanted` (package, file that shows it is present) that
/// are missing, with apt-get (through sudo unless root).
pub fn ensure_packages(wanted: &[(&str, &Path)]) -> Result<()> {
    let missing: Vec<&str> = wanted
        .iter()
        .filter(|(_, file)| !file.exists())
        .map(|(package, _)| *package)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let spinner = progress::spinner(&format!("apt-get install {}", missing.join(" ")));
    let apt = |args: &[&str]| -> Command {
        let mut cmd = if is_root() {
            Command::new("apt-get")
        } else {
            let mut c = Command::new("sudo");
            c.arg("apt-get");
            c
        };
        cmd.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        cmd
    };
    let result = run_quiet(&mut apt(&["update", "-qq"]))
        .and_then(|()| run_quiet(apt(&["install", "-y", "-qq"]).args(&missing)));
    spinner.finish_and_clear();
    result.with_context(|| format!("installing {}", missing.join(" ")))?;
    for (package, file) in wanted {
        if !file.exists() {
            bail!(
                "{package} is installed but {} is still missing",
                file.display()
            );
        }
    }
    eprintln!("installed {}", missing.join(" "));
    Ok(())
}

/// Whether process `pid` still exists.
pub fn alive(pid: u32) -> bool {
    // A zombie (exited, not yet reaped) counts as gone.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Sends `signal` (a `kill` name such as TERM or INT) to `pid`.
pub fn signal(pid: u32, signal: &str) -> Result<()> {
    run_quiet(
        Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string()),
    )
}

/// Stops `pid` with `sig`, then SIGKILL if it is still there after `grace`.
pub fn stop_pid(pid: u32, sig: &str, grace: Duration) {
    if !alive(pid) {
        return;
    }
    let _ = signal(pid, sig);
    let started = Instant::now();
    while alive(pid) && started.elapsed() < grace {
        std::thread::sleep(Duration::from_millis(20));
    }
    if alive(pid) {
        let _ = signal(pid, "KILL");
    }
}

/// A server process the suite started; stopped by PID when dropped.
pub struct Server {
    pub name: String,
    pub pid: u32,
    /// Our child when we spawned the server itself (reaped on stop).
    child: Option<Child>,
    /// The signal that stops it cleanly.
    stop_signal: &'static str,
    stopped: bool,
    pub log: PathBuf,
}

impl Server {
    /// Spawns `cmd` with its output in `log`.
    pub fn spawn(
        name: &str,
        cmd: &mut Command,
        log: PathBuf,
        stop_signal: &'static str,
    ) -> Result<Server> {
        let file = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting {name}: {}", command_line(cmd)))?;
        Ok(Server {
            name: name.to_string(),
            pid: child.id(),
            child: Some(child),
            stop_signal,
            stopped: false,
            log,
        })
    }

    /// A server that daemonized itself (its PID from its pid file).
    pub fn adopt(name: &str, pid: u32, log: PathBuf, stop_signal: &'static str) -> Server {
        Server {
            name: name.to_string(),
            pid,
            child: None,
            stop_signal,
            stopped: false,
            log,
        }
    }

    /// Fails with the end of its log when the server has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        let exited = match &mut self.child {
            Some(child) => child.try_wait()?.is_some(),
            None => !alive(self.pid),
        };
        if exited {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            bail!("{} exited: {}", self.name, tail(&log, 20));
        }
        Ok(())
    }

    /// Stops it (its clean-stop signal, then SIGKILL after 15 s) and reaps it.
    pub fn stop(&mut self) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        stop_pid(self.pid, self.stop_signal, Duration::from_secs(15));
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Retries `attempt` every 100 ms until it succeeds, the server exits, or `cap` passes.
pub fn wait_ready<T>(
    server: &mut Server,
    cap: Duration,
    mut attempt: impl FnMut() -> Result<T>,
) -> Result<T> {
    let started = Instant::now();
    loop {
        match attempt() {
            Ok(v) => return Ok(v),
            Err(e) => {
                server.check_alive()?;
                if started.elapsed() > cap {
                    return Err(e)
                        .with_context(|| format!("{} not ready after {cap:?}", server.name));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
