//! Command line, in the style of nccl-tests.

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
    /// `symmBroadcast` from rank 0 (nccl-tests' default root).
    Broadcast,
}

impl Operation {
    /// `busbw = algbw × factor` (nccl-tests' definitions).
    pub fn bus_factor(self, nranks: usize) -> f64 {
        let n = nranks as f64;
        match self {
            Operation::AllReduce => 2.0 * (n - 1.0) / n,
            Operation::AllGather | Operation::ReduceScatter => (n - 1.0) / n,
            Operation::Broadcast => 1.0,
        }
    }
}

/// Parsed options.
#[derive(Clone, Debug)]
pub struct Options {
    /// The collective.
    pub operation: Operation,
    /// Smallest size in bytes (`-b`).
    pub min_bytes: u64,
    /// Largest size in bytes (`-e`).
    pub max_bytes: u64,
    /// Size multiplier (`-f`).
    pub factor: u64,
    /// Ranks, all on device 0 (`-g`).
    pub ranks: usize,
    /// One process per rank (`--procs N`: N ranks, each in its own process, joined with
    /// `symmCommInitRank`), instead of `-g` ranks driven by one thread.
    pub procs: Option<usize>,
    /// `--batch N`: time a group of N collectives of each size (fused into one launch per
    /// device) next to N separate calls.
    pub batch: Option<usize>,
    /// Element type (`-d`).
    pub dtype: DataType,
    /// Reduction (`-o`).
    pub op: RedOp,
    /// Timed iterations (`-n`).
    pub iterations: usize,
    /// Warm-up iterations (`-w`).
    pub warmup: usize,
    /// Check results (`-c`).
    pub check: bool,
}

pub const USAGE: &str = "usage: symm-perf all_reduce|all_gather|reduce_scatter|broadcast|clc [-b minbytes] \
[-e maxbytes] [-f factor] [-g ranks] [-d int8|uint8|int32|uint32|int64|uint64|half|float|double|bfloat16|f8e4m3|f8e5m2] \
[-o sum|prod|max|min|avg] [-n iters] [-w warmup] [-c 0|1] [--procs N] [--batch N] | scale-model [--out DIR]";

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
    Ok(value * scale)
}

fn parse_dtype(text: &str) -> Result<DataType, String> {
    Ok(match text {
        "int8" => DataType::Int8,
        "uint8" => DataType::Uint8,
        "int32" | "int" => DataType::Int32,
        "uint32" => DataType::Uint32,
        "int64" => DataType::Int64,
        "uint64" => DataType::Uint64,
        "half" | "float16" => DataType::Float16,
        "float" | "float32" => DataType::Float32,
        "double" | "float64" => DataType::Float64,
        "bfloat16" => DataType::Bfloat16,
        "f8e4m3" => DataType::Float8E4M3,
        "f8e5m2" => DataType::Float8E5M2,
        _ => return Err(format!("unknown data type {text:?}")),
    })
}

fn parse_op(text: &str) -> Result<RedOp, String> {
    Ok(match text {
        "sum" => RedOp::Sum,
        "prod" => RedOp::Prod,
        "max" => RedOp::Max,
        "min" => RedOp::Min,
        "avg" => RedOp::Avg,
        _ => return Err(format!("unknown reduction {text:?}")),
    })
}

impl Options {
    /// Parse the arguments after the program name.
    pub fn parse(args: &[String]) -> Result<Options, String> {
        let operation = match args.first().map(String::as_str) {
            Some("all_reduce") => Operation::AllReduce,
            Some("all_gather") => Operation::AllGather,
            Some("reduce_scatter") => Operation::ReduceScatter,
            Some("broadcast") => Operation::Broadcast,
            _ => return Err(USAGE.to_string()),
        };
        let mut options = Options {
            operation,
            min_bytes: 8,
            max_bytes: 128 << 20,
            factor: 2,
            ranks: 8,
            procs: None,
            batch: None,
            dtype: DataType::Float32,
            op: RedOp::Sum,
            iterations: 20,
            warmup: 5,
            check: true,
        };
        let mut rest = args[1..].iter();
        while let Some(flag) = rest.next() {
            let value = rest
                .next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
            let number = || {
                value
                    .parse::<usize>()
                    .map_err(|_| format!("bad value {value:?} for {flag}"))
            };
            match flag.as_str() {
                "-b" => options.min_bytes = parse_size(value)?,
                "-e" => options.max_bytes = parse_size(value)?,
                "-f" => options.factor = number()? as u64,
                "-g" => options.ranks = number()?,
                "-d" => options.dtype = parse_dtype(value)?,
                "-o" => options.op = parse_op(value)?,
                "-n" => options.iterations = number()?,
                "-w" => options.warmup = number()?,
                "-c" => options.check = number()? != 0,
                "--batch" => options.batch = Some(number()?),
                "--procs" => {
                    options.procs = Some(number()?);
                    options.ranks = number()?;
                }
                _ => return Err(format!("unknown option {flag}\n{USAGE}")),
            }
        }
        if options.factor < 2 || options.ranks == 0 || options.iterations == 0 {
            return Err(format!("-f must be >= 2, -g and -n >= 1\n{USAGE}"));
        }
        if options.batch == Some(0) || (options.batch.is_some() && options.procs.is_some()) {
            return Err(format!(
                "--batch needs N >= 1 and all ranks in one process\n{USAGE}"
            ));
        }
        if options.min_bytes > options.max_bytes {
            return Err("-b must not exceed -e".to_string());
        }
        Ok(options)
    }

    /// The sizes to run, in bytes.
    pub fn sizes(&self) -> Vec<u64> {
        let mut sizes = Vec::new();
        let mut size = self.min_bytes.max(1);
        while size <= self.max_bytes {
            sizes.push(size);
            size = size.saturating_mul(self.factor);
        }
        sizes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nccl_tests_style_options() {
        let args: Vec<String> =
            "all_gather -b 8 -e 128M -f 4 -g 3 -d bfloat16 -o max -n 7 -w 1 -c 0"
                .split(' ')
                .map(String::from)
                .collect();
        let o = Options::parse(&args).unwrap();
        assert_eq!(o.operation, Operation::AllGather);
        assert_eq!(
            (o.min_bytes, o.max_bytes, o.factor, o.ranks),
            (8, 128 << 20, 4, 3)
        );
        assert_eq!(
            (o.dtype, o.op, o.iterations, o.warmup, o.check),
            (DataType::Bfloat16, RedOp::Max, 7, 1, false)
        );
        assert_eq!(o.sizes().len(), 13, "8 B, 32 B, …, 128 MiB");
        assert_eq!(
            Options::parse(&["broadcast".to_string()])
                .unwrap()
                .operation,
            Operation::Broadcast
        );
        assert!(Options::parse(&["alltoall".to_string()]).is_err());
        let args: Vec<String> = "all_reduce --procs 4 -b 1K"
            .split(' ')
            .map(String::from)
            .collect();
        let o = Options::parse(&args).unwrap();
        assert_eq!((o.procs, o.ranks, o.min_bytes), (Some(4), 4, 1024));
        let args: Vec<String> = "all_reduce --batch 64 -b 1K -e 1K -g 8"
            .split(' ')
            .map(String::from)
            .collect();
        let o = Options::parse(&args).unwrap();
        assert_eq!((o.batch, o.ranks, o.max_bytes), (Some(64), 8, 1024));
        let args: Vec<String> = "all_reduce --batch 0"
            .split(' ')
            .map(String::from)
            .collect();
        assert!(Options::parse(&args).is_err());
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
    }
}
