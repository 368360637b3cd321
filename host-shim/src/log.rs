//! The library's log, as `NCCL_DEBUG`: `SYMM_DEBUG=WARN|INFO|TRACE` (unset: off; an unknown
//! value warns once and logs warnings), `SYMM_DEBUG_SUBSYS` (a comma list of `INIT`, `COLL`,
//! `REG`, `PLAN`, `BOOTSTRAP`, `ALL`; a leading `^` logs every subsystem but those; default
//! `INIT,COLL,REG,PLAN,BOOTSTRAP`, i.e. all) and `SYMM_DEBUG_FILE` (a path in which `%h` is the
//! host name and `%p` the process id; unset: stderr).
//!
//! Every line is `host:pid:tid [rank] symm LEVEL message` (`[-]` outside any rank), written
//! with a single `write` so that lines of several threads or processes sharing the stream never
//! interleave within a line.

use std::ffi::CStr;
use std::fmt;
use std::io::Write;
use std::sync::OnceLock;

/// How much is logged; each level includes the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Something went wrong or looks wrong (a refused call, a fallback, a bad setting).
    Warn = 1,
    /// What the library decided: the init banner, registrations, plans and launches.
    Info = 2,
    /// Everything, per call.
    Trace = 3,
}

impl Level {
    fn name(self) -> &'static str {
        match self {
            Level::Warn => "WARN",
            Level::Info => "INFO",
            Level::Trace => "TRACE",
        }
    }
}

/// A part of the library whose lines `SYMM_DEBUG_SUBSYS` selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subsys {
    /// Communicator creation: the init banner, backend choice, devices.
    Init = 1,
    /// Collective calls and launches.
    Coll = 2,
    /// Window registration.
    Reg = 4,
    /// The planner's picks.
    Plan = 8,
    /// The bootstrap (the root, the ranks' connections).
    Bootstrap = 16,
}

const ALL_SUBSYS: u32 = 31;

/// The log's settings, read once from the environment.
struct Settings {
    level: Option<Level>,
    subsys: u32,
    file: Option<std::fs::File>,
    host: String,
}

/// `SYMM_DEBUG`: the level, and a warning when the value is not one (the level is then
/// `WARN`, as NCCL treats an unknown `NCCL_DEBUG`).
pub fn parse_level(value: Option<&str>) -> (Option<Level>, Option<String>) {
    let Some(value) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return (None, None);
    };
    match value.to_ascii_uppercase().as_str() {
        "WARN" => (Some(Level::Warn), None),
        "INFO" => (Some(Level::Info), None),
        "TRACE" => (Some(Level::Trace), None),
        "VERSION" | "ABORT" => (Some(Level::Warn), None),
        _ => (
            Some(Level::Warn),
            Some(format!(
                "SYMM_DEBUG={value:?} is not WARN, INFO or TRACE: logging warnings only"
            )),
        ),
    }
}

/// `SYMM_DEBUG_SUBSYS`: the selected subsystems as a mask, and a warning naming unknown
/// entries (which are ignored).
pub fn parse_subsys(value: Option<&str>) -> (u32, Option<String>) {
    let Some(value) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return (ALL_SUBSYS, None);
    };
    let (invert, list) = match value.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, value),
    };
    let mut mask = 0;
    let mut unknown = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        mask |= match name.to_ascii_uppercase().as_str() {
            "INIT" => Subsys::Init as u32,
            "COLL" => Subsys::Coll as u32,
            "REG" => Subsys::Reg as u32,
            "PLAN" => Subsys::Plan as u32,
            "BOOTSTRAP" => Subsys::Bootstrap as u32,
            "ALL" => ALL_SUBSYS,
            _ => {
                unknown.push(name.to_string());
                0
            }
        };
    }
    let mask = if invert { ALL_SUBSYS & !mask } else { mask };
    let warning = (!unknown.is_empty()).then(|| {
        format!(
            "SYMM_DEBUG_SUBSYS: unknown subsystem(s) {} ignored (known: INIT, COLL, REG, PLAN, \
             BOOTSTRAP, ALL)",
            unknown.join(", ")
        )
    });
    (mask, warning)
}

/// `SYMM_DEBUG_FILE`'s pattern with `%h` (host), `%p` (pid) and `%%` expanded.
pub fn expand_path(pattern: &str, host: &str, pid: u32) -> String {
    let mut out = String::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('h') => out.push_str(host),
            Some('p') => out.push_str(&pid.to_string()),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// The host name (as `gethostname` gives it; `localhost` if it fails).
fn host_name() -> String {
    let mut buffer = [0u8; 256];
    // SAFETY: the buffer is writable for its length; gethostname NUL-terminates on success
    // when the name fits, and the last byte stays 0 either way.
    let ok = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len() - 1) } == 0;
    if !ok {
        return "localhost".to_string();
    }
    CStr::from_bytes_until_nul(&buffer)
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "localhost".to_string())
}

fn settings() -> &'static Settings {
    static SETTINGS: OnceLock<Settings> = OnceLock::new();
    SETTINGS.get_or_init(|| {
        let (level, level_warning) = parse_level(std::env::var("SYMM_DEBUG").ok().as_deref());
        let (subsys, subsys_warning) =
            parse_subsys(std::env::var("SYMM_DEBUG_SUBSYS").ok().as_deref());
        let host = host_name();
        let mut file_warning = None;
        let file = match std::env::var("SYMM_DEBUG_FILE") {
            Ok(pattern) if level.is_some() && !pattern.is_empty() => {
                let path = expand_path(&pattern, &host, std::process::id());
                match std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                {
                    Ok(file) => Some(file),
                    Err(e) => {
                        file_warning = Some(format!(
                            "SYMM_DEBUG_FILE: cannot open {path:?} ({e}): logging to stderr"
                        ));
                        None
                    }
                }
            }
            _ => None,
        };
        let settings = Settings {
            level,
            subsys,
            file,
            host,
        };
        for warning in [level_warning, subsys_warning, file_warning]
            .into_iter()
            .flatten()
        {
            emit(&settings, Level::Warn, None, format_args!("{warning}"));
        }
        settings
    })
}

/// `true` when lines of `level` about `subsys` are logged.
pub fn enabled(level: Level, subsys: Subsys) -> bool {
    let settings = settings();
    settings.level.is_some_and(|l| level <= l) && settings.subsys & subsys as u32 != 0
}

/// Write `message` at `level` for `rank` (`None`: no rank); callers check [`enabled`] first
/// (the [`log!`](crate::log!) macro does), so that nothing is formatted for a line not logged.
pub fn write(level: Level, rank: Option<usize>, message: fmt::Arguments<'_>) {
    emit(settings(), level, rank, message);
}

/// One whole line: `host:pid:tid [rank] symm LEVEL message`.
pub fn format_line(
    host: &str,
    pid: u32,
    tid: i64,
    rank: Option<usize>,
    level: Level,
    message: fmt::Arguments<'_>,
) -> String {
    let rank = rank.map_or_else(|| "-".to_string(), |r| r.to_string());
    let mut line = format!(
        "{host}:{pid}:{tid} [{rank}] symm {} {message}",
        level.name()
    );
    // A message never spans lines: each physical line is one log line.
    if line.contains('\n') {
        line = line.replace('\n', " | ");
    }
    line.push('\n');
    line
}

fn emit(settings: &Settings, level: Level, rank: Option<usize>, message: fmt::Arguments<'_>) {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    let line = format_line(
        &settings.host,
        std::process::id(),
        tid,
        rank,
        level,
        message,
    );
    // One write of the whole line (the file is opened for appending; stderr is unbuffered), so
    // lines of concurrent writers never interleave within a line.
    let _ = match &settings.file {
        Some(file) => (&*file).write_all(line.as_bytes()),
        None => std::io::stderr().lock().write_all(line.as_bytes()),
    };
}

/// `log!(Level::Info, Subsys::Coll, Some(rank), "...", args)`: format only when enabled.
#[macro_export]
macro_rules! log {
    ($level:expr, $subsys:expr, $rank:expr, $($arg:tt)*) => {
        if $crate::log::enabled($level, $subsys) {
            $crate::log::write($level, $rank, format_args!($($arg)*));
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_as_nccl_debug_and_an_unknown_value_warns() {
        assert_eq!(parse_level(None), (None, None));
        assert_eq!(parse_level(Some("")), (None, None));
        assert_eq!(parse_level(Some("info")).0, Some(Level::Info));
        assert_eq!(parse_level(Some("TRACE")).0, Some(Level::Trace));
        assert_eq!(parse_level(Some("Warn")), (Some(Level::Warn), None));
        let (level, warning) = parse_level(Some("verbose"));
        assert_eq!(level, Some(Level::Warn));
        assert!(warning.unwrap().contains("\"verbose\""));
        assert!(Level::Warn < Level::Info && Level::Info < Level::Trace);
    }

    #[test]
    fn subsystems_select_include_exclude_and_name_unknown_entries() {
        assert_eq!(parse_subsys(None).0, ALL_SUBSYS);
        assert_eq!(
            parse_subsys(Some("INIT,coll")).0,
            Subsys::Init as u32 | Subsys::Coll as u32
        );
        assert_eq!(
            parse_subsys(Some("^PLAN")).0,
            ALL_SUBSYS & !(Subsys::Plan as u32)
        );
        assert_eq!(parse_subsys(Some("ALL")).0, ALL_SUBSYS);
        let (mask, warning) = parse_subsys(Some("REG,NET"));
        assert_eq!(mask, Subsys::Reg as u32);
        assert!(warning.unwrap().contains("NET"));
    }

    #[test]
    fn file_patterns_expand_host_and_pid() {
        assert_eq!(
            expand_path("/tmp/symm.%h.%p.log", "node7", 42),
            "/tmp/symm.node7.42.log"
        );
        assert_eq!(expand_path("100%%-%x%", "h", 1), "100%-%x%");
    }

    #[test]
    fn a_line_is_prefixed_and_whole() {
        let line = format_line("node7", 42, 43, Some(3), Level::Info, format_args!("a\nb"));
        assert_eq!(line, "node7:42:43 [3] symm INFO a | b\n");
        let line = format_line("h", 1, 2, None, Level::Warn, format_args!("x"));
        assert_eq!(line, "h:1:2 [-] symm WARN x\n");
    }
}
