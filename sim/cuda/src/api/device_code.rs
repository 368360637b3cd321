//! The PTX inside NVIDIA's device-code containers, for the linker's non-PTX inputs: a
//! fatbinary (`CU_JIT_INPUT_FATBINARY`), a host object whose fatbin section holds device code
//! (`CU_JIT_INPUT_OBJECT`, what `nvcc -dc` writes) and an archive of such objects
//! (`CU_JIT_INPUT_LIBRARY`, what `nvcc -lib` writes, e.g. `libsymm_device.a`).
//!
//! A GPU takes the fatbin's SASS for its architecture where there is one and JIT-compiles the
//! PTX otherwise; the simulated GPU executes PTX only, so it always takes the PTX entry of the
//! newest virtual architecture it runs (compute_90 or older). A container with no such entry
//! is refused as a GPU refuses one without code for it.
//!
//! Layouts (little-endian, as `nvcc` 12–13 writes them):
//! * fatbin: a 16-byte header (magic `0xBA55ED50`, version `u16`, header size `u16`, size of
//!   the entries `u64`), then entries: kind `u16` (1 PTX, 2 ELF/SASS), version `u16`, header
//!   size `u32`, payload size `u64` (padded), compressed size `u32`, `u32`, minor `u16`, major
//!   `u16`, architecture `u32` (80 for compute_80), name offset and length `u32`, flags `u64`
//!   (`0x8000`: the payload is a zstd frame; `0x2000`: LZ4), `u64`, uncompressed size `u64`;
//!   the payload follows the entry's header;
//! * object: ELF64, the fatbin in section `__nv_relfatbin` (relocatable device code) or
//!   `.nv_fatbin`;
//! * archive: `!<arch>\n`, then members of a 60-byte header (size in decimal at bytes
//!   48..58) and their data, padded to an even length.

use std::fmt;

/// `CU_JIT_INPUT_CUBIN`.
pub const INPUT_CUBIN: u32 = 0;
/// `CU_JIT_INPUT_PTX`.
pub const INPUT_PTX: u32 = 1;
/// `CU_JIT_INPUT_FATBINARY`.
pub const INPUT_FATBINARY: u32 = 2;
/// `CU_JIT_INPUT_OBJECT`.
pub const INPUT_OBJECT: u32 = 3;
/// `CU_JIT_INPUT_LIBRARY`.
pub const INPUT_LIBRARY: u32 = 4;

/// The newest virtual architecture the simulated GPU runs (it reports compute capability 9.0).
pub const SIMULATED_ARCH: u32 = 90;

/// The fatbin header's magic number.
const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// Entry kind: PTX text.
const ENTRY_PTX: u16 = 1;
/// Entry flag: the payload is LZ4-compressed.
const FLAG_LZ4: u64 = 0x2000;
/// Entry flag: the payload is a zstd frame.
const FLAG_ZSTD: u64 = 0x8000;
/// The first bytes of a zstd frame.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];
/// Largest PTX text taken from one entry (a bound on what a corrupt header can allocate).
const MAX_PTX_BYTES: u64 = 1 << 30;
/// ELF section names that hold fatbins.
const FATBIN_SECTIONS: [&str; 2] = ["__nv_relfatbin", ".nv_fatbin"];

/// Why no PTX came out of an input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceCodeError {
    /// Not a linker input kind (`CUjitInputType`).
    InvalidKind(u32),
    /// A PTX input that is not text.
    NotText,
    /// The container is cut short or inconsistent (what is wrong, in words).
    Malformed(String),
    /// Well formed, but nothing the simulated GPU runs: no PTX entry for compute_90 or older
    /// (SASS only, a cubin, or PTX for newer targets only).
    NoCodeForGpu(String),
    /// A compression the simulator does not read (LZ4).
    Unsupported(String),
}

impl fmt::Display for DeviceCodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidKind(kind) => write!(f, "{kind} is not a linker input kind"),
            Self::NotText => write!(f, "a PTX input that is not UTF-8 text"),
            Self::Malformed(why) => write!(f, "malformed device code: {why}"),
            Self::NoCodeForGpu(why) => write!(
                f,
                "no PTX for compute_{SIMULATED_ARCH} or older ({why}); the simulated GPU runs \
                 PTX, not SASS"
            ),
            Self::Unsupported(why) => write!(f, "unsupported device code: {why}"),
        }
    }
}

/// The PTX texts an input of linker kind `kind` contributes, in order: one for PTX, one per
/// fatbin for a fatbinary or an object (a section may hold several, e.g. after `ld -r`, and an
/// object several sections), and those of every member with device code for an archive.
///
/// Unlike NVIDIA's linker, which takes from an archive only the members that define what is
/// still undefined, every member with device code is linked: members that define the same
/// function fail here where the driver would link.
pub fn ptx_of_input(kind: u32, bytes: &[u8]) -> Result<Vec<String>, DeviceCodeError> {
    match kind {
        INPUT_PTX => Ok(vec![ptx_text(bytes)?]),
        INPUT_FATBINARY => ptx_of_fatbins(bytes),
        INPUT_OBJECT => ptx_of_object(bytes),
        INPUT_LIBRARY => ptx_of_archive(bytes),
        INPUT_CUBIN => Err(DeviceCodeError::NoCodeForGpu(
            "a cubin holds SASS only".into(),
        )),
        other => Err(DeviceCodeError::InvalidKind(other)),
    }
}

/// PTX text without the trailing NULs of a C string or a padded payload.
fn ptx_text(bytes: &[u8]) -> Result<String, DeviceCodeError> {
    let text = std::str::from_utf8(bytes).map_err(|_| DeviceCodeError::NotText)?;
    Ok(text.trim_end_matches('\0').to_string())
}

/// `a + b`, or a malformed-container error naming `what` when it overflows.
fn add(a: u64, b: u64, what: &str) -> Result<u64, DeviceCodeError> {
    a.checked_add(b)
        .ok_or_else(|| DeviceCodeError::Malformed(format!("{what}: offset overflow")))
}

/// `len` bytes of `bytes` at `at`, or a malformed-container error naming `what`.
fn slice<'a>(bytes: &'a [u8], at: u64, len: u64, what: &str) -> Result<&'a [u8], DeviceCodeError> {
    match at.checked_add(len) {
        Some(end) if end <= bytes.len() as u64 => Ok(&bytes[at as usize..end as usize]),
        _ => Err(DeviceCodeError::Malformed(format!(
            "{what}: {len} bytes at {at} past the end ({})",
            bytes.len()
        ))),
    }
}

fn u16_at(bytes: &[u8], at: u64, what: &str) -> Result<u16, DeviceCodeError> {
    let b = slice(bytes, at, 2, what)?;
    Ok(u16::from_le_bytes([b[0], b[1]]))
}

fn u32_at(bytes: &[u8], at: u64, what: &str) -> Result<u32, DeviceCodeError> {
    let b = slice(bytes, at, 4, what)?;
    Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")))
}

fn u64_at(bytes: &[u8], at: u64, what: &str) -> Result<u64, DeviceCodeError> {
    let b = slice(bytes, at, 8, what)?;
    Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

/// One fatbin entry's header fields that choosing and reading the PTX needs.
struct Entry<'a> {
    kind: u16,
    arch: u32,
    flags: u64,
    uncompressed: u64,
    compressed: u32,
    payload: &'a [u8],
}

/// The entries of each fatbin in `bytes` (a section may hold several, one after another).
fn fatbins(bytes: &[u8]) -> Result<Vec<Vec<Entry<'_>>>, DeviceCodeError> {
    let mut fatbins = Vec::new();
    let mut at = 0u64;
    while at < bytes.len() as u64 {
        // Fatbins in one section are 8-byte aligned; what follows the last may be padding.
        if bytes[at as usize..].iter().all(|&b| b == 0) {
            break;
        }
        let magic = u32_at(bytes, at, "fatbin header")?;
        if magic != FATBIN_MAGIC {
            return Err(DeviceCodeError::Malformed(format!(
                "fatbin magic {magic:#x} at {at}, expected {FATBIN_MAGIC:#x}"
            )));
        }
        let header = u64::from(u16_at(bytes, at + 6, "fatbin header")?);
        if header < 16 {
            return Err(DeviceCodeError::Malformed(format!(
                "fatbin header of {header} bytes at {at}"
            )));
        }
        let size = u64_at(bytes, at + 8, "fatbin header")?;
        let body = slice(bytes, at + header, size, "fatbin entries")?;
        let mut entries = Vec::new();
        let mut e = 0u64;
        while e < size {
            let kind = u16_at(body, e, "fatbin entry")?;
            let entry_header = u64::from(u32_at(body, e + 4, "fatbin entry")?);
            let payload_size = u64_at(body, e + 8, "fatbin entry")?;
            if entry_header < 64 {
                return Err(DeviceCodeError::Malformed(format!(
                    "fatbin entry header of {entry_header} bytes"
                )));
            }
            entries.push(Entry {
                kind,
                compressed: u32_at(body, e + 16, "fatbin entry")?,
                arch: u32_at(body, e + 28, "fatbin entry")?,
                flags: u64_at(body, e + 40, "fatbin entry")?,
                uncompressed: u64_at(body, e + 56, "fatbin entry")?,
                payload: slice(body, e + entry_header, payload_size, "fatbin payload")?,
            });
            // The payload slice above ends inside `body`: no overflow.
            e += entry_header + payload_size;
        }
        fatbins.push(entries);
        // `body` ended inside `bytes`, and `header` is at least 16: `at` moves on.
        at = (at + header + size).next_multiple_of(8);
    }
    Ok(fatbins)
}

/// The PTX of each fatbin in `bytes` (see `best_ptx`): an error when one of them has none
/// the simulated GPU runs, or when there is no fatbin at all.
pub fn ptx_of_fatbins(bytes: &[u8]) -> Result<Vec<String>, DeviceCodeError> {
    let all = fatbins(bytes)?;
    if all.is_empty() {
        return Err(DeviceCodeError::NoCodeForGpu("no fatbin".into()));
    }
    all.iter().map(|entries| best_ptx(entries)).collect()
}

/// The text of the PTX entry of one fatbin's `entries` for the newest architecture up to
/// [`SIMULATED_ARCH`].
fn best_ptx(entries: &[Entry<'_>]) -> Result<String, DeviceCodeError> {
    let best = entries
        .iter()
        .filter(|e| e.kind == ENTRY_PTX && e.arch <= SIMULATED_ARCH)
        .max_by_key(|e| e.arch);
    let Some(entry) = best else {
        let held: Vec<String> = entries
            .iter()
            .map(|e| {
                if e.kind == ENTRY_PTX {
                    format!("PTX for {}", e.arch)
                } else {
                    format!("code of kind {} (SASS or other) for {}", e.kind, e.arch)
                }
            })
            .collect();
        return Err(DeviceCodeError::NoCodeForGpu(if held.is_empty() {
            "an empty fatbin".into()
        } else {
            format!("it holds {}", held.join(", "))
        }));
    };
    let bytes = if entry.flags & FLAG_ZSTD != 0 || entry.payload.starts_with(&ZSTD_MAGIC) {
        decompress_zstd(entry)?
    } else if entry.flags & FLAG_LZ4 != 0 {
        return Err(DeviceCodeError::Unsupported(
            "an LZ4-compressed fatbin entry (rebuild with nvcc 12.8 or newer, or \
             --compress-mode=none)"
                .into(),
        ));
    } else {
        entry.payload.to_vec()
    };
    ptx_text(&bytes)
}

/// The zstd payload of `entry`, decompressed to its recorded size.
fn decompress_zstd(entry: &Entry<'_>) -> Result<Vec<u8>, DeviceCodeError> {
    if entry.uncompressed > MAX_PTX_BYTES {
        return Err(DeviceCodeError::Malformed(format!(
            "an entry of {} bytes uncompressed",
            entry.uncompressed
        )));
    }
    let frame = entry
        .payload
        .get(..entry.compressed as usize)
        .filter(|_| entry.compressed > 0)
        .unwrap_or(entry.payload);
    // Streamed, so that memory follows what the frame really holds, not what a corrupt header
    // claims; one byte past the recorded size is read to catch a longer frame.
    let malformed = |e: &dyn fmt::Display| DeviceCodeError::Malformed(format!("zstd payload: {e}"));
    let decoder = ruzstd::decoding::StreamingDecoder::new(frame).map_err(|e| malformed(&e))?;
    let mut out = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(decoder, entry.uncompressed + 1),
        &mut out,
    )
    .map_err(|e| malformed(&e))?;
    if out.len() as u64 != entry.uncompressed {
        return Err(DeviceCodeError::Malformed(format!(
            "zstd payload of {} bytes or more, the header says {}",
            out.len(),
            entry.uncompressed
        )));
    }
    Ok(out)
}

/// Whether `bytes` start as an ELF file.
fn is_elf(bytes: &[u8]) -> bool {
    bytes.starts_with(b"\x7fELF")
}

/// The fatbin sections of the ELF64 object `bytes`, in section order (none for host code only).
fn fatbin_sections(bytes: &[u8]) -> Result<Vec<&[u8]>, DeviceCodeError> {
    if !is_elf(bytes) || bytes.get(4) != Some(&2) || bytes.get(5) != Some(&1) {
        return Err(DeviceCodeError::Malformed(
            "not a little-endian ELF64 object".into(),
        ));
    }
    let section_headers = u64_at(bytes, 0x28, "ELF header")?;
    let entry_size = u64::from(u16_at(bytes, 0x3A, "ELF header")?);
    let count = u64::from(u16_at(bytes, 0x3C, "ELF header")?);
    let names_index = u64::from(u16_at(bytes, 0x3E, "ELF header")?);
    // No section headers, or more than e_shnum holds (SHN_XINDEX): nothing this reads.
    if count == 0 || names_index >= count {
        return Ok(Vec::new());
    }
    if entry_size < 64 {
        return Err(DeviceCodeError::Malformed(format!(
            "ELF section headers of {entry_size} bytes"
        )));
    }
    let what = "ELF section header";
    let section = |i: u64| -> Result<(u32, &[u8]), DeviceCodeError> {
        // i < count <= 65535 and entry_size <= 65535: the product does not overflow.
        let at = add(section_headers, i * entry_size, what)?;
        let name = u32_at(bytes, at, what)?;
        let kind = u32_at(bytes, add(at, 4, what)?, what)?;
        let offset = u64_at(bytes, add(at, 24, what)?, what)?;
        let size = u64_at(bytes, add(at, 32, what)?, what)?;
        // SHT_NOBITS occupies no bytes of the file.
        let data = if kind == 8 {
            &[][..]
        } else {
            slice(bytes, offset, size, "ELF section")?
        };
        Ok((name, data))
    };
    let (_, names) = section(names_index)?;
    let mut found = Vec::new();
    for i in 0..count {
        let (name, data) = section(i)?;
        let name = names
            .get(name as usize..)
            .and_then(|rest| rest.split(|&b| b == 0).next())
            .and_then(|n| std::str::from_utf8(n).ok())
            .unwrap_or("");
        if FATBIN_SECTIONS.contains(&name) {
            found.push(data);
        }
    }
    Ok(found)
}

/// The PTX of every fatbin of the host object `bytes`.
pub fn ptx_of_object(bytes: &[u8]) -> Result<Vec<String>, DeviceCodeError> {
    let sections = fatbin_sections(bytes)?;
    if sections.is_empty() {
        return Err(DeviceCodeError::NoCodeForGpu(
            "the object has no fatbin section".into(),
        ));
    }
    let mut texts = Vec::new();
    for section in sections {
        texts.extend(ptx_of_fatbins(section)?);
    }
    Ok(texts)
}

/// The PTX of every member of the archive `bytes` that holds device code, in member order.
pub fn ptx_of_archive(bytes: &[u8]) -> Result<Vec<String>, DeviceCodeError> {
    const MAGIC: &[u8] = b"!<arch>\n";
    if !bytes.starts_with(MAGIC) {
        return Err(DeviceCodeError::Malformed("not an ar archive".into()));
    }
    let mut texts = Vec::new();
    let mut at = MAGIC.len() as u64;
    while at < bytes.len() as u64 {
        let header = slice(bytes, at, 60, "archive member header")?;
        if &header[58..60] != b"`\n" {
            return Err(DeviceCodeError::Malformed(format!(
                "archive member header at {at}"
            )));
        }
        let size: u64 = std::str::from_utf8(&header[48..58])
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| DeviceCodeError::Malformed(format!("archive member size at {at}")))?;
        let data = slice(bytes, at + 60, size, "archive member")?;
        // The symbol table ("/") and long names ("//") are not ELF; host-only objects have
        // no fatbin section.
        if is_elf(data) {
            for section in fatbin_sections(data)? {
                texts.extend(ptx_of_fatbins(section)?);
            }
        }
        // The member's data ended inside `bytes`: no overflow.
        at = (at + 60 + size).next_multiple_of(2);
    }
    if texts.is_empty() {
        return Err(DeviceCodeError::NoCodeForGpu(
            "no archive member holds device code".into(),
        ));
    }
    Ok(texts)
}

/// The PTX of the one fatbin in `bytes` (tests).
#[cfg(test)]
fn ptx_of_fatbin(bytes: &[u8]) -> Result<String, DeviceCodeError> {
    let mut texts = ptx_of_fatbins(bytes)?;
    assert_eq!(texts.len(), 1, "one fatbin");
    Ok(texts.remove(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PTX_80: &str = ".version 7.0\n.target sm_80\n.address_size 64\n// eighty\n";
    const PTX_90: &str = ".version 8.0\n.target sm_90\n.address_size 64\n// ninety\n";
    const PTX_100: &str = ".version 8.7\n.target sm_100a\n.address_size 64\n// hundred\n";

    /// One fatbin entry as nvcc writes it: `zstd` compresses the payload.
    fn entry(kind: u16, arch: u32, payload: &[u8], zstd: bool) -> Vec<u8> {
        let (data, flags, compressed, uncompressed) = if zstd {
            let frame = ruzstd::encoding::compress_to_vec(
                payload,
                ruzstd::encoding::CompressionLevel::Fastest,
            );
            let n = frame.len() as u32;
            (frame, 0x8011u64, n, payload.len() as u64)
        } else {
            (payload.to_vec(), 0x11u64, 0, 0)
        };
        let padded = (data.len() as u64).next_multiple_of(8);
        let header_size: u32 = if kind == ENTRY_PTX { 96 } else { 64 };
        let mut out = Vec::new();
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(&0x0101u16.to_le_bytes());
        out.extend_from_slice(&header_size.to_le_bytes());
        out.extend_from_slice(&padded.to_le_bytes());
        out.extend_from_slice(&compressed.to_le_bytes());
        out.extend_from_slice(&64u32.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&7u16.to_le_bytes());
        out.extend_from_slice(&arch.to_le_bytes());
        out.extend_from_slice(&[0; 8]);
        out.extend_from_slice(&flags.to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes());
        out.extend_from_slice(&uncompressed.to_le_bytes());
        out.resize(header_size as usize, 0);
        out.extend_from_slice(&data);
        out.resize(header_size as usize + padded as usize, 0);
        out
    }

    fn fatbin(entries: &[Vec<u8>]) -> Vec<u8> {
        let body: Vec<u8> = entries.concat();
        let mut out = Vec::new();
        out.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
        out.extend_from_slice(&1u16.to_le_bytes());
        out.extend_from_slice(&16u16.to_le_bytes());
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// A minimal ELF64 object: a null section, `section` with `data`, and the name table.
    fn object(section: &str, data: &[u8]) -> Vec<u8> {
        object_with(&[(section, data)])
    }

    /// A minimal ELF64 object: a null section, each `(name, data)` in order, the name table.
    fn object_with(sections: &[(&str, &[u8])]) -> Vec<u8> {
        let mut names = vec![0u8];
        let mut name_at = Vec::new();
        for (name, _) in sections {
            name_at.push(names.len() as u32);
            names.extend_from_slice(name.as_bytes());
            names.push(0);
        }
        let names_name = names.len() as u32;
        names.extend_from_slice(b".shstrtab\0");
        let mut out = vec![0u8; 64];
        let mut data_at = Vec::new();
        for (_, data) in sections {
            data_at.push(out.len() as u64);
            out.extend_from_slice(data);
        }
        let names_at = out.len() as u64;
        out.extend_from_slice(&names);
        let headers_at = (out.len() as u64).next_multiple_of(8);
        out.resize(headers_at as usize, 0);
        out[..6].copy_from_slice(b"\x7fELF\x02\x01");
        out[0x28..0x30].copy_from_slice(&headers_at.to_le_bytes());
        out[0x3A..0x3C].copy_from_slice(&64u16.to_le_bytes());
        out[0x3C..0x3E].copy_from_slice(&(sections.len() as u16 + 2).to_le_bytes());
        out[0x3E..0x40].copy_from_slice(&(sections.len() as u16 + 1).to_le_bytes());
        let header = |name: u32, kind: u32, offset: u64, size: u64| {
            let mut h = vec![0u8; 64];
            h[..4].copy_from_slice(&name.to_le_bytes());
            h[4..8].copy_from_slice(&kind.to_le_bytes());
            h[24..32].copy_from_slice(&offset.to_le_bytes());
            h[32..40].copy_from_slice(&size.to_le_bytes());
            h
        };
        out.extend(header(0, 0, 0, 0));
        for (k, (_, data)) in sections.iter().enumerate() {
            out.extend(header(name_at[k], 1, data_at[k], data.len() as u64));
        }
        out.extend(header(names_name, 3, names_at, names.len() as u64));
        out
    }

    fn archive(members: &[(&str, Vec<u8>)]) -> Vec<u8> {
        let mut out = b"!<arch>\n".to_vec();
        for (name, data) in members {
            let mut header = format!(
                "{name:<16}{:<12}{:<6}{:<6}{:<8}{:<10}`\n",
                0,
                0,
                0,
                644,
                data.len()
            )
            .into_bytes();
            header.truncate(60);
            out.extend_from_slice(&header);
            out.extend_from_slice(data);
            if out.len() % 2 == 1 {
                out.push(b'\n');
            }
        }
        out
    }

    #[test]
    fn the_newest_ptx_the_simulated_gpu_runs_is_taken_compressed_or_not() {
        for zstd in [false, true] {
            let bin = fatbin(&[
                entry(2, 90, b"\x7fELF sass", zstd),
                entry(ENTRY_PTX, 80, PTX_80.as_bytes(), zstd),
                entry(ENTRY_PTX, 90, PTX_90.as_bytes(), zstd),
                entry(ENTRY_PTX, 100, PTX_100.as_bytes(), zstd),
            ]);
            assert_eq!(ptx_of_fatbin(&bin).unwrap(), PTX_90, "zstd {zstd}");
            assert_eq!(
                ptx_of_input(INPUT_FATBINARY, &bin).unwrap(),
                vec![PTX_90.to_string()]
            );
        }
    }

    #[test]
    fn sass_only_or_newer_ptx_only_is_no_code_for_the_gpu() {
        let sass_only = fatbin(&[entry(2, 90, b"\x7fELF sass", true)]);
        let newer = fatbin(&[entry(ENTRY_PTX, 100, PTX_100.as_bytes(), false)]);
        for bin in [sass_only, newer] {
            let error = ptx_of_fatbin(&bin).unwrap_err();
            assert!(matches!(error, DeviceCodeError::NoCodeForGpu(_)), "{error}");
        }
        assert!(matches!(
            ptx_of_input(INPUT_CUBIN, b"\x7fELF").unwrap_err(),
            DeviceCodeError::NoCodeForGpu(_)
        ));
    }

    #[test]
    fn objects_and_archives_yield_their_fatbins_ptx() {
        let bin = fatbin(&[entry(ENTRY_PTX, 80, PTX_80.as_bytes(), true)]);
        for section in FATBIN_SECTIONS {
            let obj = object(section, &bin);
            assert_eq!(ptx_of_input(INPUT_OBJECT, &obj).unwrap(), vec![PTX_80]);
        }
        let other = fatbin(&[entry(ENTRY_PTX, 90, PTX_90.as_bytes(), false)]);
        let host_only = object(".text", b"\x90\x90\x90");
        // An odd-sized member exercises the padding; the symbol table is skipped.
        let lib = archive(&[
            ("/", vec![0, 0, 0, 0, 1]),
            ("a.o/", object("__nv_relfatbin", &bin)),
            ("host.o/", host_only.clone()),
            ("b.o/", object(".nv_fatbin", &other)),
        ]);
        assert_eq!(
            ptx_of_input(INPUT_LIBRARY, &lib).unwrap(),
            vec![PTX_80.to_string(), PTX_90.to_string()]
        );
        let no_device_code = archive(&[("host.o/", host_only.clone())]);
        assert!(matches!(
            ptx_of_input(INPUT_LIBRARY, &no_device_code).unwrap_err(),
            DeviceCodeError::NoCodeForGpu(_)
        ));
        assert!(matches!(
            ptx_of_input(INPUT_OBJECT, &host_only).unwrap_err(),
            DeviceCodeError::NoCodeForGpu(_)
        ));
    }

    #[test]
    fn several_fatbins_in_a_section_and_several_sections_all_count() {
        let a = fatbin(&[entry(ENTRY_PTX, 80, PTX_80.as_bytes(), true)]);
        let b = fatbin(&[entry(ENTRY_PTX, 90, PTX_90.as_bytes(), false)]);
        // Two fatbins one after another (8-byte aligned), then padding, as `ld -r` leaves them.
        let mut both = a.clone();
        both.resize(both.len().next_multiple_of(8), 0);
        both.extend_from_slice(&b);
        both.extend_from_slice(&[0; 16]);
        assert_eq!(
            ptx_of_input(INPUT_FATBINARY, &both).unwrap(),
            vec![PTX_80.to_string(), PTX_90.to_string()]
        );
        assert_eq!(
            ptx_of_input(INPUT_OBJECT, &object("__nv_relfatbin", &both)).unwrap(),
            vec![PTX_80.to_string(), PTX_90.to_string()]
        );
        // An object with both sections: each one's PTX.
        let two = object_with(&[("__nv_relfatbin", &a), (".nv_fatbin", &b)]);
        assert_eq!(
            ptx_of_input(INPUT_OBJECT, &two).unwrap(),
            vec![PTX_80.to_string(), PTX_90.to_string()]
        );
    }

    #[test]
    fn hostile_headers_end_in_an_error_not_a_hang_or_panic() {
        // A fatbin header of size 0 with no entries would never move on.
        let mut zero = FATBIN_MAGIC.to_le_bytes().to_vec();
        zero.extend_from_slice(&[1, 0, 0, 0]);
        zero.extend_from_slice(&0u64.to_le_bytes());
        assert!(matches!(
            ptx_of_input(INPUT_FATBINARY, &zero).unwrap_err(),
            DeviceCodeError::Malformed(_)
        ));
        // Section headers "at" the end of the address space.
        let bin = fatbin(&[entry(ENTRY_PTX, 80, PTX_80.as_bytes(), true)]);
        let mut far = object("__nv_relfatbin", &bin);
        far[0x28..0x30].copy_from_slice(&(u64::MAX - 8).to_le_bytes());
        assert!(matches!(
            ptx_of_input(INPUT_OBJECT, &far).unwrap_err(),
            DeviceCodeError::Malformed(_)
        ));
        // No section headers at all: host code only.
        let mut none = object("__nv_relfatbin", &bin);
        none[0x3C..0x3E].copy_from_slice(&0u16.to_le_bytes());
        assert!(matches!(
            ptx_of_input(INPUT_OBJECT, &none).unwrap_err(),
            DeviceCodeError::NoCodeForGpu(_)
        ));
        // A header claiming 1 GiB behind a small frame: refused after the frame's real size.
        let mut huge = bin.clone();
        huge[16 + 56..16 + 64].copy_from_slice(&(1u64 << 30).to_le_bytes());
        assert!(matches!(
            ptx_of_fatbin(&huge).unwrap_err(),
            DeviceCodeError::Malformed(_)
        ));
        assert_eq!(
            ptx_of_input(7, b"").unwrap_err(),
            DeviceCodeError::InvalidKind(7)
        );
    }

    #[test]
    fn cut_or_corrupt_containers_are_malformed_not_a_panic() {
        let bin = fatbin(&[entry(ENTRY_PTX, 80, PTX_80.as_bytes(), true)]);
        let obj = object("__nv_relfatbin", &bin);
        let lib = archive(&[("a.o/", obj.clone())]);
        for (kind, whole) in [
            (INPUT_FATBINARY, &bin),
            (INPUT_OBJECT, &obj),
            (INPUT_LIBRARY, &lib),
        ] {
            // The last cut falls in the object's last section header (its size field).
            for cut in [1, 7, 16, 40, whole.len() / 2, whole.len() - 30] {
                let result = ptx_of_input(kind, &whole[..cut]);
                assert!(
                    matches!(
                        result,
                        Err(DeviceCodeError::Malformed(_) | DeviceCodeError::NoCodeForGpu(_))
                    ),
                    "kind {kind} cut at {cut}: {result:?}"
                );
            }
        }
        let mut wrong_size = bin.clone();
        // The uncompressed size the PTX entry's header records.
        wrong_size[16 + 56] ^= 1;
        assert!(matches!(
            ptx_of_fatbin(&wrong_size).unwrap_err(),
            DeviceCodeError::Malformed(_)
        ));
        let mut lz4 = fatbin(&[entry(ENTRY_PTX, 80, PTX_80.as_bytes(), false)]);
        lz4[16 + 41] |= 0x20; // flags |= 0x2000 (its second byte)
        assert!(matches!(
            ptx_of_fatbin(&lz4).unwrap_err(),
            DeviceCodeError::Unsupported(_)
        ));
        assert_eq!(
            ptx_of_input(INPUT_PTX, &[0xff, 0xfe]).unwrap_err(),
            DeviceCodeError::NotText
        );
    }
}
