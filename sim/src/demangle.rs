//! Readable names for the (Rust v0-mangled) PTX symbols fault reports print.

/// A readable name for a (Rust v0-mangled) PTX symbol: `a::b::c`, or the name itself.
pub(crate) fn demangle(name: &str) -> String {
    let Some(rest) = name.strip_prefix("_R") else {
        return name.to_string();
    };
    let b = rest.as_bytes();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'N' => i += 2,
            b'C' => {
                i += 1;
                if b.get(i) == Some(&b's') {
                    while i < b.len() && b[i] != b'_' {
                        i += 1;
                    }
                    i += 1;
                }
            }
            c if c.is_ascii_digit() => {
                let start = i;
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1;
                }
                let n: usize = rest[start..i].parse().unwrap_or(0);
                if b.get(i) == Some(&b'_') {
                    i += 1;
                }
                if i + n > b.len() {
                    return name.to_string();
                }
                parts.push(&rest[i..i + n]);
                i += n;
            }
            _ => return name.to_string(),
        }
    }
    if parts.is_empty() {
        name.to_string()
    } else {
        parts.join("::")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demangles_rust_v0_paths() {
        assert_eq!(
            demangle("_RNvNtNtCsby7Xz2y7qhS_4core9panicking11panic_const23panic_const_div_by_zero"),
            "core::panicking::panic_const::panic_const_div_by_zero"
        );
        assert_eq!(demangle("symm_all_gather"), "symm_all_gather");
    }
}
