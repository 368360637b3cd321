//! The library's log (`SYMM_DEBUG`, `SYMM_DEBUG_SUBSYS`, `SYMM_DEBUG_FILE`), observed from
//! outside: each test re-runs this binary's ignored child in new processes with the variables
//! set, and reads what they logged.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use symm_tests::*;

/// Start the child test in a new process with `env` set (on the host backend).
fn spawn_child(env: &[(&str, &str)]) -> Child {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--ignored", "--exact", "child_all_reduces", "--nocapture"])
        .env("SYMM_BACKEND", "host")
        .env_remove("SYMM_DEBUG")
        .env_remove("SYMM_DEBUG_SUBSYS")
        .env_remove("SYMM_DEBUG_FILE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    command.spawn().expect("re-running the test binary")
}

/// Run the child; its stderr (the log, unless a file is named).
fn run_child(env: &[(&str, &str)]) -> String {
    let output = spawn_child(env).wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "child failed:\n{stderr}");
    stderr
}

/// The log lines of `text` (the test harness's own lines left out).
fn log_lines(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.contains(" symm ")).collect()
}

/// `host:pid:tid [rank] symm LEVEL message`: the pid, the rank field and the level.
fn parse(line: &str) -> Option<(u32, String, String)> {
    let (prefix, rest) = line.split_once(' ')?;
    let mut fields = prefix.rsplitn(3, ':');
    let tid = fields.next()?;
    let pid = fields.next()?;
    let host = fields.next()?;
    if host.is_empty() || tid.parse::<i64>().is_err() {
        return None;
    }
    let pid = pid.parse().ok()?;
    let rest = rest.strip_prefix('[')?;
    let (rank, rest) = rest.split_once("] symm ")?;
    if rank != "-" && rank.parse::<usize>().is_err() {
        return None;
    }
    let (level, message) = rest.split_once(' ')?;
    if !["WARN", "INFO", "TRACE"].contains(&level) || message.is_empty() {
        return None;
    }
    Some((pid, rank.to_string(), level.to_string()))
}

#[test]
fn info_lines_are_prefixed_and_say_what_was_decided() {
    let log = run_child(&[("SYMM_DEBUG", "INFO")]);
    let lines = log_lines(&log);
    assert!(!lines.is_empty(), "nothing logged:\n{log}");
    for line in &lines {
        assert!(parse(line).is_some(), "not a log line: {line:?}");
    }
    let has = |needle: &str| lines.iter().any(|l| l.contains(needle));
    // The init banner: version, rank, backend and why, devices, how the ranks joined.
    assert!(
        has(&format!(
            "[0] symm INFO symm {} rank 0 of 2: backend host",
            env!("CARGO_PKG_VERSION")
        )),
        "{log}"
    );
    assert!(has("backend host (SYMM_BACKEND=host)"), "{log}");
    assert!(has("every rank in this process"), "{log}");
    // Registrations, plans and launches.
    assert!(has("[1] symm INFO window #0 registered: ["), "{log}");
    assert!(
        has("[0] symm INFO plan: all_reduce 1000 x Float32 Sum"),
        "{log}"
    );
    assert!(has("symm INFO launch: all_reduce of 1 task(s)"), "{log}");
}

#[test]
fn subsystems_select_lines_and_warn_level_is_quiet_when_all_goes_well() {
    let log = run_child(&[("SYMM_DEBUG", "INFO"), ("SYMM_DEBUG_SUBSYS", "REG")]);
    let lines = log_lines(&log);
    assert!(!lines.is_empty(), "{log}");
    assert!(
        lines.iter().all(|l| l.contains("window #")),
        "only registrations expected:\n{log}"
    );
    let log = run_child(&[("SYMM_DEBUG", "INFO"), ("SYMM_DEBUG_SUBSYS", "^PLAN,COLL")]);
    assert!(
        !log.contains(" plan: ") && !log.contains(" launch: "),
        "{log}"
    );
    assert!(log.contains("window #0 registered"), "{log}");
    let log = run_child(&[("SYMM_DEBUG", "WARN")]);
    assert!(log_lines(&log).is_empty(), "{log}");
    let log = run_child(&[]);
    assert!(log_lines(&log).is_empty(), "{log}");
}

#[test]
fn an_unknown_level_warns_once() {
    let log = run_child(&[("SYMM_DEBUG", "verbose")]);
    let warnings: Vec<_> = log_lines(&log)
        .into_iter()
        .filter(|l| l.contains("SYMM_DEBUG=\"verbose\" is not WARN, INFO or TRACE"))
        .collect();
    assert_eq!(warnings.len(), 1, "{log}");
    assert_eq!(parse(warnings[0]).unwrap().2, "WARN");
}

/// A file per process (`%p`), and one file that several processes append to at once: every
/// line whole, none lost.
#[test]
fn log_files_expand_the_pid_and_never_interleave_lines() {
    let dir = std::env::temp_dir().join(format!("symm-log-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let pattern = dir.join("own.%p.log");
    let child = spawn_child(&[
        ("SYMM_DEBUG", "TRACE"),
        ("SYMM_DEBUG_FILE", pattern.to_str().unwrap()),
    ]);
    let pid = child.id();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success());
    let own = std::fs::read_to_string(dir.join(format!("own.{pid}.log"))).unwrap();
    assert!(log_lines(&String::from_utf8_lossy(&output.stderr)).is_empty());
    assert!(own.lines().count() > 5, "{own}");
    for line in own.lines() {
        assert_eq!(parse(line).map(|p| p.0), Some(pid), "{line:?}");
    }
    // Four processes, one file.
    let shared: PathBuf = dir.join("shared.log");
    let children: Vec<Child> = (0..4)
        .map(|_| {
            spawn_child(&[
                ("SYMM_DEBUG", "TRACE"),
                ("SYMM_DEBUG_FILE", shared.to_str().unwrap()),
                ("SYMM_TEST_REPEAT", "20"),
            ])
        })
        .collect();
    let pids: Vec<u32> = children.iter().map(Child::id).collect();
    for child in children {
        assert!(child.wait_with_output().unwrap().status.success());
    }
    let text = std::fs::read_to_string(&shared).unwrap();
    let mut per_pid = vec![0usize; pids.len()];
    for line in text.lines() {
        let (pid, _, _) = parse(line).unwrap_or_else(|| panic!("broken line {line:?}"));
        let index = pids.iter().position(|p| *p == pid).expect("a child's pid");
        per_pid[index] += 1;
    }
    assert!(
        per_pid.iter().all(|n| *n == per_pid[0] && *n > 20),
        "{per_pid:?}"
    );
    remove(&dir);
}

fn remove(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
#[ignore = "child process of the logging tests"]
fn child_all_reduces() {
    let repeat: usize = std::env::var("SYMM_TEST_REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    two_rank_grouped_all_reduces(repeat);
}
