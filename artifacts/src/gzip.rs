//! The gzip container (RFC 1952) of the checked-in PTX (`ptx-out/*.ptx.gz`): one member, no
//! optional fields, a raw DEFLATE stream (miniz_oxide), CRC-32 and length checked on reading.
//! `cargo xtask ptx` writes the files with [`compress`]; libsymm reads them with
//! [`decompress`]. Any gzip tool reads them too (`gunzip -k ptx-out/symm_sm90.ptx.gz`).

/// The gzip magic bytes, the DEFLATE method, and no flags.
const HEADER_START: [u8; 4] = [0x1f, 0x8b, 8, 0];
/// Bytes of the fixed header (magic, method, flags, time, extra flags, OS).
const HEADER_BYTES: usize = 10;
/// Bytes of the trailer (CRC-32 and length, little-endian).
const TRAILER_BYTES: usize = 8;
/// The largest file accepted when reading (the PTX files are about 17 MB).
const MAX_TEXT_BYTES: usize = 256 << 20;

/// CRC-32 (IEEE 802.3, reflected, as gzip uses).
pub fn crc32(data: &[u8]) -> u32 {
    const fn table() -> [u32; 256] {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                k += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    }
    static TABLE: [u32; 256] = table();
    !data.iter().fold(!0u32, |crc, &byte| {
        TABLE[((crc ^ byte as u32) & 0xff) as usize] ^ (crc >> 8)
    })
}

/// `data` as a gzip file: the same bytes for the same input (time 0, OS "unknown").
pub fn compress(data: &[u8]) -> Vec<u8> {
    let deflated = miniz_oxide::deflate::compress_to_vec(data, 9);
    let mut out = Vec::with_capacity(HEADER_BYTES + deflated.len() + TRAILER_BYTES);
    out.extend_from_slice(&HEADER_START);
    out.extend_from_slice(&[0, 0, 0, 0, 2, 255]);
    out.extend_from_slice(&deflated);
    out.extend_from_slice(&crc32(data).to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out
}

/// The contents of a gzip file written by [`compress`], or why it cannot be read.
pub fn decompress(file: &[u8]) -> Result<Vec<u8>, String> {
    if file.len() < HEADER_BYTES + TRAILER_BYTES || file[..4] != HEADER_START {
        return Err("not a gzip file without optional fields".to_string());
    }
    let body = &file[HEADER_BYTES..file.len() - TRAILER_BYTES];
    let trailer = &file[file.len() - TRAILER_BYTES..];
    let data = miniz_oxide::inflate::decompress_to_vec_with_limit(body, MAX_TEXT_BYTES)
        .map_err(|e| format!("corrupt DEFLATE stream: {e:?}"))?;
    let crc = u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
    let len = u32::from_le_bytes([trailer[4], trailer[5], trailer[6], trailer[7]]);
    if crc32(&data) != crc || data.len() as u32 != len {
        return Err("CRC-32 or length mismatch".to_string());
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn round_trips_and_rejects_damage() {
        let text = b".version 7.8\n.target sm_90\n".repeat(1000);
        let file = compress(&text);
        assert!(file.len() < text.len() / 10);
        assert_eq!(decompress(&file).unwrap(), text);
        assert_eq!(compress(&text), file, "deterministic");
        let mut flipped = file.clone();
        let last = flipped.len() - TRAILER_BYTES - 1;
        flipped[last] ^= 1;
        assert!(decompress(&flipped).is_err());
        let mut wrong_crc = file.clone();
        let at = wrong_crc.len() - TRAILER_BYTES;
        wrong_crc[at] ^= 1;
        assert!(decompress(&wrong_crc).is_err());
        assert!(decompress(&file[..5]).is_err());
        assert!(decompress(b"not gzip at all, long enough").is_err());
    }
}
