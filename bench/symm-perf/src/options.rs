//! Command line, in the style of nccl-tests: the same short and long options, the same type and
//! operator names, and the same meaning where an option means something here.

use symm_device::{DataType, RedOp};

/// The collective to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// `symmAllReduce`.
    AllReduce,
    /// `symmAllGather`.
    AllGather,
    /// `symmReduceScatter`.
    ReduceScatter,
    /// `symmBroadcast` from `-r` (default 0, nccl-tests' default root).
    Broadcast,
    /// `symmReduce` to `-r` (only the root's result is checked).
    Reduce,
}

impl Operation {
    /// `busbw = algbw × factor` (nccl-tests' definitions).
    pub fn bus_factor(self, nranks: usize) -> f64 {
        let n = nranks as f64;
        match self {
            Operation::AllReduce => 2.0 * (n - 1.0) / n,
            Operation::AllGather | Operation::ReduceScatter => (n - 1.0) / n,
            Operation::Broadcast | Operation::Reduce => 1.0,
        }
    }

    /// `true` when the collective applies `-o` (nccl-tests prints `none` for the others).
    pub fn reduces(self) -> bool {
        matches!(
            self,
            Operation::AllReduce | Operation::ReduceScatter | Operation::Reduce
        )
    }

    /// `true` when the collective has a root (nccl-tests prints `-1` for the others).
    pub fn rooted(self) -> bool {
        matches!(self, Operation::Broadcast | Operation::Reduce)
    }
}

/// How the sizes grow from `-b` to `-e`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// `-f N`: multiply by N.
    Factor(u64),
    /// `-i N`: add N bytes.
    Bytes(u64),
}

/// Which rank's time a row reports (`-a`, nccl-tests' `--average`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Average {
    /// `-a 0`: rank 0's.
    Rank0,
    /// `-a 1` (default): the mean over ranks.
    Mean,
    /// `-a 2`: the fastest rank's.
    Min,
    /// `-a 3`: the slowest rank's.
    Max,
}

/// Parsed options.
#[derive(Clone, Debug)]
pub struct Options {
    /// The collective.
    pub operation: Operation,
    /// Smallest size in bytes (`-b`, `--minbytes`).
    pub min_bytes: u64,
    /// Largest size in bytes (`-e`, `--maxbytes`).
    pub max_bytes: u64,
    /// Size step (`-f`, `--stepfactor`; `-i`, `--stepbytes`).
    pub step: Step,
    /// Ranks, all on device 0 (`-g`, `--ngpus`).
    pub ranks: usize,
    /// One process per rank (`--procs N`: N ranks, each in its own process, joined with
    /// `symmCommInitRank`), instead of `-g` ranks driven by one thread.
    pub procs: Option<usize>,
    /// `--machines M` (with `--procs N`): the N ranks play M machines of N / M consecutive
    /// ranks each (`SYMM_HOST_ID`), one communicator across them; calls are not grouped.
    pub machines: Option<usize>,
    /// `--batch N`: time a group of N collectives of each size (fused into one launch per
    /// device) next to N separate calls.
    pub batch: Option<usize>,
    /// Element type (`-d`, `--datatype`).
    pub dtype: DataType,
    /// Reduction (`-o`, `--op`); all-gather and broadcast accept it and ignore it.
    pub op: RedOp,
    /// Root of a broadcast (`-r`, `--root`).
    pub root: usize,
    /// Timed iterations (`-n`, `--iters`).
    pub iterations: usize,
    /// Warm-up iterations (`-w`, `--warmup_iters`).
    pub warmup: usize,
    /// Check results (`-c`, `--check`).
    pub check: bool,
    /// `-G`, `--cudagraph` (cuda backend): `0` times eager launches with CUDA events; `N`
    /// (default 1) captures one collective into a CUDA graph and times `N` replays of it per
    /// iteration. `None`: not given (the default).
    pub graph_launches: Option<usize>,
    /// `-a`, `--average`: which rank's time a row reports.
    pub average: Average,
    /// `-z`, `--blocking` (cuda backend): wait for each collective before issuing the next.
    pub blocking: bool,
    /// `-R`, `--local_register`: `true` (2, the default) puts every buffer in a symmetric
    /// window; `false` (0) leaves them in the process's own memory, so the library stages
    /// every call through its communicator's staging window.
    pub in_windows: bool,
}

pub const USAGE: &str = "usage: symm-perf all_reduce|all_gather|reduce_scatter|broadcast|reduce [options] | clc [options] | scale-model [--out DIR]
options (nccl-tests' names):
  -b, --minbytes <size>       smallest size (default 8; K, M, G suffixes)
  -e, --maxbytes <size>       largest size (default 128M)
  -f, --stepfactor <n>        multiply the size by n (default 2)
  -i, --stepbytes <size>      add size bytes instead of multiplying
  -g, --ngpus <n>             ranks, all on device 0, driven by this thread (default 8)
  -d, --datatype <type>       int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 f8e4m3 f8e5m2
  -o, --op <op>               sum prod max min avg (all_gather, broadcast: ignored, shown as none)
  -r, --root <rank>           broadcast and reduce root (default 0)
  -n, --iters <n>             timed iterations (default 20)
  -w, --warmup_iters <n>      warm-up iterations (default 5)
  -c, --check <0|1>           check every result (default 1)
  -G, --cudagraph <n>         cuda: 0 = time eager launches, n = replays of a CUDA graph per iteration (default 1)
  -a, --average <0|1|2|3>     with --procs: report rank 0's, the mean, the min or the max time (default 1)
  -z, --blocking <0|1>        cuda: wait for each collective before the next (needs -G 0)
  -R, --local_register <0|2>  2 = buffers in symmetric windows (default); 0 = the process's own memory, staged
  --procs <n>                 n processes of one rank each (symmCommInitRank), as under torchrun
  --machines <m>              with --procs: the ranks play m machines (SYMM_HOST_ID), one communicator across them
  --batch <n>                 a group of n collectives per size, fused, next to n separate calls";

/// The element types, in nccl-tests' spelling: the one name `-d` takes and the tables print.
const TYPE_NAMES: [(DataType, &str); 12] = [
    (DataType::Int8, "int8"),
    (DataType::Uint8, "uint8"),
    (DataType::Int32, "int32"),
    (DataType::Uint32, "uint32"),
    (DataType::Int64, "int64"),
    (DataType::Uint64, "uint64"),
    (DataType::Float16, "half"),
    (DataType::Float32, "float"),
    (DataType::Float64, "double"),
    (DataType::Bfloat16, "bfloat16"),
    (DataType::Float8E4M3, "f8e4m3"),
    (DataType::Float8E5M2, "f8e5m2"),
];

/// nccl-tests' name of `dtype`.
pub fn type_name(dtype: DataType) -> &'static str {
    TYPE_NAMES
        .iter()
        .find(|(t, _)| *t == dtype)
        .map(|(_, name)| *name)
        .expect("every type is in the table")
}

/// The operator column of a row: nccl-tests prints `none` for collectives that do not reduce.
pub fn op_name(operation: Operation, op: RedOp) -> &'static str {
    if operation.reduces() {
        op.short_name()
    } else {
        "none"
    }
}

/// Parse `8`, `64K`, `128M`, `1G`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let (digits, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => text.split_at(i),
        None => (text, ""),
    };
    let value: u64 = digits.parse().map_err(|_| format!("bad size {text:?}"))?;
    let scale = match unit {
        "" | "B" => 1,
        "K" | "k" => 1 << 10,
        "M" | "m" => 1 << 20,
        "G" | "g" => 1 << 30,
        _ => return Err(format!("bad size unit in {text:?}")),
    };
    value
        .checked_mul(scale)
        .ok_or_else(|| format!("size {text:?} is too large"))
}

fn parse_dtype(text: &str) -> Result<DataType, String> {
    TYPE_NAMES
        .iter()
        .find(|(_, name)| *name == text)
        .map(|(t, _)| *t)
        .ok_or_else(|| {
            let names: Vec<&str> = TYPE_NAMES.iter().map(|(_, n)| *n).collect();
            format!("unknown data type {text:?}: one of {}", names.join(" "))
        })
}

fn parse_op(text: &str) -> Result<RedOp, String> {
    RedOp::ALL
        .into_iter()
        .find(|op| op.short_name() == text)
        .ok_or_else(|| format!("unknown reduction {text:?}: one of sum prod max min avg"))
}

/// The option's canonical short name (`--minbytes` → `-b`), or the flag itself.
fn short_flag(flag: &str) -> &str {
    match flag {
        "--minbytes" => "-b",
        "--maxbytes" => "-e",
        "--stepfactor" => "-f",
        "--stepbytes" => "-i",
        "--ngpus" => "-g",
        "--datatype" => "-d",
        "--op" => "-o",
        "--root" => "-r",
        "--iters" => "-n",
        "--warmup_iters" => "-w",
        "--check" => "-c",
        "--cudagraph" => "-G",
        "--average" => "-a",
        "--blocking" => "-z",
        "--local_register" => "-R",
        other => other,
    }
}

/// nccl-tests options that mean nothing here, with the reason given when one is used.
const NOT_HERE: [(&str, &str, &str); 4] = [
    (
        "-t",
        "--nthreads",
        "one thread drives all -g ranks; --procs N runs one process per rank",
    ),
    (
        "-p",
        "--parallel_init",
        "ranks are created by symmCommInitAll or one per process",
    ),
    (
        "-m",
        "--agg_iters",
        "use --batch N to time N collectives in one group",
    ),
    ("-T", "--timeout", "set SYMM_TIMEOUT_MS"),
];

fn number(flag: &str, value: &str) -> Result<usize, String> {
    value
        .parse::<usize>()
        .map_err(|_| format!("bad value {value:?} for {flag}: a non-negative integer"))
}

fn flag_0_1(flag: &str, value: &str) -> Result<bool, String> {
    match value {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err(format!("bad value {value:?} for {flag}: 0 or 1")),
    }
}

impl Options {
    /// Parse the arguments after the program name.
    pub fn parse(args: &[String]) -> Result<Options, String> {
        let operation = match args.first().map(String::as_str) {
            Some("all_reduce") => Operation::AllReduce,
            Some("all_gather") => Operation::AllGather,
            Some("reduce_scatter") => Operation::ReduceScatter,
            Some("broadcast") => Operation::Broadcast,
            Some("reduce") => Operation::Reduce,
            Some(other) => {
                return Err(format!(
                    "unknown collective {other:?}: all_reduce, all_gather, reduce_scatter, broadcast or reduce\n{USAGE}"
                ));
            }
            None => return Err(USAGE.to_string()),
        };
        let mut options = Options {
            operation,
            min_bytes: 8,
            max_bytes: 128 << 20,
            step: Step::Factor(2),
            ranks: 8,
            procs: None,
            machines: None,
            batch: None,
            dtype: DataType::Float32,
            op: RedOp::Sum,
            root: 0,
            iterations: 20,
            warmup: 5,
            check: true,
            graph_launches: None,
            average: Average::Mean,
            blocking: false,
            in_windows: true,
        };
        let mut rest = args[1..].iter();
        while let Some(arg) = rest.next() {
            // `--name=value` as getopt_long takes it, or `--name value` / `-x value`.
            let (flag, value) = match arg.split_once('=') {
                Some((flag, value)) if flag.starts_with("--") => (flag, value.to_string()),
                _ => {
                    let value = rest
                        .next()
                        .ok_or_else(|| format!("{arg} needs a value\n{USAGE}"))?;
                    (arg.as_str(), value.clone())
                }
            };
            let value = value.as_str();
            match short_flag(flag) {
                "-b" => options.min_bytes = parse_size(value)?,
                "-e" => options.max_bytes = parse_size(value)?,
                "-f" => options.step = Step::Factor(number(flag, value)? as u64),
                "-i" => options.step = Step::Bytes(parse_size(value)?),
                "-g" => options.ranks = number(flag, value)?,
                "-d" => options.dtype = parse_dtype(value)?,
                "-o" => options.op = parse_op(value)?,
                "-r" => options.root = number(flag, value)?,
                "-n" => options.iterations = number(flag, value)?,
                "-w" => options.warmup = number(flag, value)?,
                "-c" => options.check = flag_0_1(flag, value)?,
                "-G" => options.graph_launches = Some(number(flag, value)?),
                "-a" => {
                    options.average = match value {
                        "0" => Average::Rank0,
                        "1" => Average::Mean,
                        "2" => Average::Min,
                        "3" => Average::Max,
                        _ => {
                            return Err(format!(
                                "bad value {value:?} for {flag}: 0 (rank 0), 1 (mean), 2 (min) or 3 (max)"
                            ));
                        }
                    }
                }
                "-z" => options.blocking = flag_0_1(flag, value)?,
                "-R" => {
                    options.in_windows = match value {
                        "2" => true,
                        "0" => false,
                        _ => {
                            return Err(format!(
                                "-R {value}: 2 (symmetric windows) or 0 (own memory, staged); \
                                 symm has no local registration\n{USAGE}"
                            ));
                        }
                    }
                }
                "--batch" => options.batch = Some(number(flag, value)?),
                "--machines" => options.machines = Some(number(flag, value)?),
                "--procs" => {
                    options.procs = Some(number(flag, value)?);
                    options.ranks = number(flag, value)?;
                }
                _ => {
                    if let Some((short, long, why)) = NOT_HERE
                        .iter()
                        .find(|(short, long, _)| flag == *short || flag == *long)
                    {
                        return Err(format!(
                            "{short} ({long}) has no meaning in symm-perf: {why}"
                        ));
                    }
                    return Err(format!("unknown option {flag}\n{USAGE}"));
                }
            }
        }
        options.validate()?;
        Ok(options)
    }

    fn validate(&self) -> Result<(), String> {
        match self.step {
            Step::Factor(f) if f < 2 => return Err(format!("-f must be >= 2\n{USAGE}")),
            Step::Bytes(0) => return Err(format!("-i must be >= 1\n{USAGE}")),
            _ => {}
        }
        if self.ranks == 0 || self.iterations == 0 {
            return Err(format!("-g, --procs and -n must be >= 1\n{USAGE}"));
        }
        if self.batch == Some(0) || (self.batch.is_some() && self.procs.is_some()) {
            return Err(format!(
                "--batch needs N >= 1 and all ranks in one process\n{USAGE}"
            ));
        }
        if let Some(m) = self.machines
            && (self.procs.is_none() || m < 2 || !self.ranks.is_multiple_of(m))
        {
            return Err(format!(
                "--machines {m} needs --procs N with N a multiple of it, and at least 2\n{USAGE}"
            ));
        }
        if self.min_bytes > self.max_bytes {
            return Err(format!(
                "-b ({}) must not exceed -e ({})",
                self.min_bytes, self.max_bytes
            ));
        }
        if self.root >= self.ranks {
            return Err(format!(
                "-r {} is not a rank of {} ranks",
                self.root, self.ranks
            ));
        }
        if self.blocking && self.graph_launches.is_some_and(|g| g > 0) {
            return Err(
                "-z 1 waits between collectives, which a CUDA graph cannot: use -G 0".to_string(),
            );
        }
        if self.sizes().is_empty() {
            return Err(self.no_rows());
        }
        Ok(())
    }

    /// The sizes to run, in bytes: from `-b` to `-e`, each at least one element on every rank
    /// (smaller sizes give no row, as in nccl-tests).
    pub fn sizes(&self) -> Vec<u64> {
        let mut sizes = Vec::new();
        let mut size = self.min_bytes.max(1);
        while size <= self.max_bytes {
            if size >= self.smallest_size() {
                sizes.push(size);
            }
            let next = match self.step {
                Step::Factor(f) => size.saturating_mul(f),
                Step::Bytes(b) => size.saturating_add(b),
            };
            if next == size {
                break;
            }
            size = next;
        }
        sizes
    }

    /// The smallest size that holds one element per rank for this collective.
    pub fn smallest_size(&self) -> u64 {
        let element = self.dtype.size_bytes() as u64;
        match self.operation {
            Operation::AllReduce | Operation::Broadcast | Operation::Reduce => element,
            Operation::AllGather | Operation::ReduceScatter => element * self.ranks as u64,
        }
    }

    /// Why `-b` … `-e` gives no row.
    fn no_rows(&self) -> String {
        let per_rank = match self.operation {
            Operation::AllGather | Operation::ReduceScatter => {
                format!(" on each of {} ranks", self.ranks)
            }
            _ => String::new(),
        };
        format!(
            "no size to run: -b {} .. -e {} has no size of at least {} bytes (one element of {}{per_rank}); raise -e",
            self.min_bytes,
            self.max_bytes,
            self.smallest_size(),
            type_name(self.dtype),
        )
    }
}

/// The three header lines of a table, as nccl-tests prints them: the out-of-place and in-place
/// groups, the column names, and their units.
pub fn table_header(floor: bool) -> [String; 3] {
    let mut names = format!(
        "# {:>12} {:>12} {:>8} {:>6} {:>6} {:>22}",
        "size", "count", "type", "redop", "root", "algorithm"
    );
    let mut units = format!(
        "# {:>12} {:>12} {:>8} {:>6} {:>6} {:>22}",
        "(B)", "(elements)", "", "", "", ""
    );
    let prefix = names.len();
    for _ in 0..2 {
        names += &format!(
            " | {:>10} {:>9} {:>9} {:>6}",
            "time", "algbw", "busbw", "#wrong"
        );
        units += &format!(
            " | {:>10} {:>9} {:>9} {:>6}",
            "(us)", "(GB/s)", "(GB/s)", ""
        );
        if floor {
            names += &format!(" {:>6}", "floor");
            units += &format!(" {:>6}", "(%)");
        }
    }
    // Each group title is centred over its columns, between the same bars.
    let width = (names.len() - prefix) / 2 - 2;
    let groups = format!(
        "#{:prefix$} |{:^width$} |{:^width$}",
        "",
        "out-of-place",
        "in-place",
        prefix = prefix - 1
    );
    [groups, names, units].map(|line| line.trim_end().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Options, String> {
        let args: Vec<String> = line.split(' ').map(String::from).collect();
        Options::parse(&args)
    }

    #[test]
    fn parses_nccl_tests_style_options() {
        let o =
            parse("all_gather -b 8 -e 128M -f 4 -g 3 -d bfloat16 -o max -n 7 -w 1 -c 0").unwrap();
        assert_eq!(o.operation, Operation::AllGather);
        assert_eq!(
            (o.min_bytes, o.max_bytes, o.step, o.ranks),
            (8, 128 << 20, Step::Factor(4), 3)
        );
        assert_eq!(
            (o.dtype, o.op, o.iterations, o.warmup, o.check),
            (DataType::Bfloat16, RedOp::Max, 7, 1, false)
        );
        assert_eq!(
            o.sizes().len(),
            13,
            "8 B (one element per rank), 32 B, …, 128 MiB"
        );
        assert_eq!(parse("broadcast").unwrap().operation, Operation::Broadcast);
        assert_eq!(parse("reduce").unwrap().operation, Operation::Reduce);
        let error = parse("alltoall").unwrap_err();
        assert!(
            error.starts_with("unknown collective \"alltoall\""),
            "{error}"
        );
        let o = parse("all_reduce --procs 4 -b 1K").unwrap();
        assert_eq!((o.procs, o.ranks, o.min_bytes), (Some(4), 4, 1024));
        let o = parse("all_reduce --batch 64 -b 1K -e 1K -g 8").unwrap();
        assert_eq!((o.batch, o.ranks, o.max_bytes), (Some(64), 8, 1024));
        assert!(parse("all_reduce --batch 0").is_err());
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert!(parse_size("99999999999G").is_err());
    }

    #[test]
    fn long_options_mean_what_the_short_ones_do() {
        let long = parse(
            "reduce_scatter --minbytes 1K --maxbytes=1M --stepfactor 4 --ngpus 4 --datatype half \
             --op min --iters 3 --warmup_iters 2 --check 0 --cudagraph 0 --average 3 --blocking 1",
        )
        .unwrap();
        let short = parse(
            "reduce_scatter -b 1K -e 1M -f 4 -g 4 -d half -o min -n 3 -w 2 -c 0 -G 0 -a 3 -z 1",
        )
        .unwrap();
        for o in [&long, &short] {
            assert_eq!(
                (o.min_bytes, o.max_bytes, o.step, o.ranks),
                (1024, 1 << 20, Step::Factor(4), 4)
            );
            assert_eq!(
                (o.dtype, o.op, o.iterations, o.warmup, o.check),
                (DataType::Float16, RedOp::Min, 3, 2, false)
            );
            assert_eq!(
                (o.graph_launches, o.average, o.blocking),
                (Some(0), Average::Max, true)
            );
        }
        let o = parse("broadcast --root 3 -g 4 -i 1K -b 1K -e 4K").unwrap();
        assert_eq!(o.root, 3);
        assert_eq!(o.sizes(), [1024, 2048, 3072, 4096]);
        assert_eq!(parse("all_reduce -G 5").unwrap().graph_launches, Some(5));
    }

    #[test]
    fn bad_values_say_what_is_wrong() {
        let cases = [
            ("all_reduce -z 1 -G 2", "use -G 0"),
            ("broadcast -g 4 -r 4", "-r 4 is not a rank of 4 ranks"),
            (
                "all_reduce -a 7",
                "0 (rank 0), 1 (mean), 2 (min) or 3 (max)",
            ),
            ("all_reduce -c yes", "0 or 1"),
            ("all_reduce -d float32", "one of int8 uint8"),
            ("all_reduce -o mean", "one of sum prod"),
            (
                "all_reduce -t 2",
                "-t (--nthreads) has no meaning in symm-perf",
            ),
            ("all_reduce --timeout 5", "SYMM_TIMEOUT_MS"),
            ("all_reduce -x 1", "unknown option -x"),
            (
                "all_reduce -b 2M -e 1M",
                "-b (2097152) must not exceed -e (1048576)",
            ),
            ("all_reduce -i 0", "-i must be >= 1"),
            ("all_reduce -n", "-n needs a value"),
        ];
        for (line, expected) in cases {
            let error = parse(line).unwrap_err();
            assert!(error.contains(expected), "{line}: {error}");
        }
    }

    #[test]
    fn a_size_range_with_no_rows_is_refused_with_the_reason() {
        let error = parse("all_gather -b 8 -e 16 -g 8 -d float").unwrap_err();
        assert!(
            error.starts_with("no size to run: -b 8 .. -e 16 has no size of at least 32 bytes"),
            "{error}"
        );
        assert!(error.contains("raise -e"), "{error}");
        let error = parse("all_reduce -b 1 -e 4 -d double").unwrap_err();
        assert!(error.contains("at least 8 bytes"), "{error}");
        assert_eq!(
            parse("all_reduce -b 1 -e 8 -d double").unwrap().sizes(),
            [8]
        );
    }

    #[test]
    fn one_spelling_per_type_and_none_for_collectives_that_do_not_reduce() {
        for dtype in DataType::ALL {
            assert_eq!(parse_dtype(type_name(dtype)).unwrap(), dtype);
        }
        assert_eq!(type_name(DataType::Float32), "float");
        assert_eq!(type_name(DataType::Float16), "half");
        assert_eq!(op_name(Operation::AllGather, RedOp::Max), "none");
        assert_eq!(op_name(Operation::Broadcast, RedOp::Sum), "none");
        assert_eq!(op_name(Operation::ReduceScatter, RedOp::Max), "max");
        // `-o` is accepted for the gathers, as nccl-tests accepts it.
        assert!(parse("all_gather -o max").is_ok());
    }

    #[test]
    fn the_header_has_nccl_tests_groups_names_and_units() {
        for floor in [false, true] {
            let [groups, names, units] = table_header(floor);
            assert!(groups.contains("out-of-place") && groups.contains("in-place"));
            assert!(groups.find("out-of-place") < groups.find("in-place"));
            for word in [
                "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
            ] {
                assert!(names.contains(word), "{word} in {names}");
            }
            for unit in ["(B)", "(elements)", "(us)", "(GB/s)"] {
                assert!(units.contains(unit), "{unit} in {units}");
            }
            assert_eq!(names.contains("floor"), floor);
            // The groups' separators line up with the column groups'.
            let bars = |s: &str| s.match_indices('|').map(|(i, _)| i).collect::<Vec<_>>();
            assert_eq!(bars(&groups), bars(&names)[..2]);
            assert_eq!(groups, groups.trim_end());
            assert_eq!(bars(&names), bars(&units));
        }
    }
}
