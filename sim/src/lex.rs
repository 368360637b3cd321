//! Tokens of PTX text.

/// A token kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A name: directive (`.reg`), opcode (`ld.global.b32`), register (`%r1`), label, symbol.
    Ident,
    /// A numeric literal (integer or `0f`/`0d` float), without sign.
    Num,
    /// A string literal (quotes included).
    Str,
    /// One punctuation character.
    Punct,
}

/// A token: its kind, its text and its 1-based line.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tok<'a> {
    pub kind: Kind,
    pub text: &'a str,
    pub line: u32,
}

impl Tok<'_> {
    /// Whether this is punctuation `c`.
    pub fn is(&self, c: &str) -> bool {
        self.kind == Kind::Punct && self.text == c
    }
}

fn ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || matches!(c, b'_' | b'.' | b'$' | b'%')
}

fn ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'$' | b'%')
}

/// The tokens of `text`, or the line of a character that starts no token.
pub(crate) fn tokenize(text: &str) -> Result<Vec<Tok<'_>>, (u32, String)> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(text.len() / 5);
    let mut i = 0;
    let mut line = 1u32;
    while i < bytes.len() {
        let c = bytes[i];
        if c == b'\n' {
            line += 1;
            i += 1;
            continue;
        }
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if c == b'/' && bytes.get(i + 1) == Some(&b'/') {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if c == b'/' && bytes.get(i + 1) == Some(&b'*') {
            i += 2;
            while i < bytes.len() && !(bytes[i] == b'*' && bytes.get(i + 1) == Some(&b'/')) {
                if bytes[i] == b'\n' {
                    line += 1;
                }
                i += 1;
            }
            i += 2;
            continue;
        }
        let start = i;
        let kind = if ident_start(c) {
            while i < bytes.len() && ident_char(bytes[i]) {
                i += 1;
            }
            Kind::Ident
        } else if c.is_ascii_digit() {
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'.') {
                i += 1;
            }
            Kind::Num
        } else if c == b'"' {
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' && bytes[i] != b'\n' {
                i += 1;
            }
            if i >= bytes.len() || bytes[i] != b'"' {
                return Err((line, "unterminated string".into()));
            }
            i += 1;
            Kind::Str
        } else if b",;:{}()[]+-<>=@!|".contains(&c) {
            i += 1;
            Kind::Punct
        } else {
            return Err((line, format!("unexpected character {:?}", c as char)));
        };
        out.push(Tok {
            kind,
            text: &text[start..i],
            line,
        });
    }
    Ok(out)
}

/// The value of an integer literal (decimal, `0x` hex, `0b` binary, octal, optional `U`
/// suffix), wrapping into 64 bits.
pub(crate) fn parse_int(text: &str) -> Option<u64> {
    let t = text.strip_suffix(['U', 'u']).unwrap_or(text);
    let (digits, radix) = if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        (h, 16)
    } else if let Some(b) = t.strip_prefix("0b").or_else(|| t.strip_prefix("0B")) {
        (b, 2)
    } else if t.len() > 1 && t.starts_with('0') {
        (&t[1..], 8)
    } else {
        (t, 10)
    };
    if digits.is_empty() {
        return None;
    }
    let v = u128::from_str_radix(digits, radix).ok()?;
    if v > u64::MAX as u128 {
        return None;
    }
    Some(v as u64)
}

/// A float literal: `0fXXXXXXXX` (f32 bits) or `0dXXXXXXXXXXXXXXXX` (f64 bits).
pub(crate) enum FloatLit {
    /// f32 bits.
    F32(u32),
    /// f64 bits.
    F64(u64),
}

/// The float literal `text`, if it is one.
pub(crate) fn parse_float(text: &str) -> Option<FloatLit> {
    if let Some(h) = text.strip_prefix("0f").or_else(|| text.strip_prefix("0F"))
        && h.len() == 8
    {
        return u32::from_str_radix(h, 16).ok().map(FloatLit::F32);
    }
    if let Some(h) = text.strip_prefix("0d").or_else(|| text.strip_prefix("0D"))
        && h.len() == 16
    {
        return u64::from_str_radix(h, 16).ok().map(FloatLit::F64);
    }
    if text.contains('.') || text.contains(['e', 'E']) && !text.starts_with("0x") {
        return text.parse::<f64>().ok().map(|v| FloatLit::F64(v.to_bits()));
    }
    None
}
