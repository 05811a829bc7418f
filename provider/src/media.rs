//! Which attachments reach the model as native content blocks, and how large they may be: the
//! one table the runner (which turns an attachment into a [`crate::MediaFile`]) and the Claude
//! driver (which encodes it) both follow.
//!
//! The Messages API measures the base64 data: an image may be at most 5 MiB of base64, a
//! request at most 32 MB. A PDF is capped below that so the conversation still fits, and all the
//! media of one message together share a budget for the same reason.

/// The kind of native content block a file becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NativeKind {
    /// An `image` block (JPEG, PNG, GIF, WebP).
    Image,
    /// A `document` block (PDF).
    Pdf,
}

/// Largest image sent natively: its base64 stays within the API's 5 MiB per image.
pub const MAX_IMAGE_BYTES: u64 = 5 * 1024 * 1024 / 4 * 3;
/// Largest PDF sent natively: its base64 (4/3 of it, about 28 MB) leaves room in the 32 MB
/// request for the conversation.
pub const MAX_PDF_BYTES: u64 = 20 * 1024 * 1024;
/// Raw bytes of all the media of one message together (the same request limit).
pub const MAX_TOTAL_BYTES: u64 = 24_000_000;

// The caps hold the API's limits (checked at compile time): an image's base64 within 5 MiB, a
// PDF's within the 32 MB request, and one PDF within a message's budget.
const _: () = assert!(MAX_IMAGE_BYTES.div_ceil(3) * 4 <= 5 * 1024 * 1024);
const _: () = assert!(MAX_PDF_BYTES.div_ceil(3) * 4 < 32_000_000);
const _: () = assert!(MAX_PDF_BYTES <= MAX_TOTAL_BYTES);

impl NativeKind {
    /// The largest file of this kind sent natively.
    pub fn max_bytes(self) -> u64 {
        match self {
            NativeKind::Image => MAX_IMAGE_BYTES,
            NativeKind::Pdf => MAX_PDF_BYTES,
        }
    }
}

/// Normalises a MIME type (lower case, no parameters, `image/jpg` → `image/jpeg`) and says which
/// native block it becomes, if any.
pub fn native_kind(mime: &str) -> Option<(&'static str, NativeKind)> {
    let essence = mime
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    match essence.as_str() {
        "image/jpeg" | "image/jpg" | "image/pjpeg" => Some(("image/jpeg", NativeKind::Image)),
        "image/png" => Some(("image/png", NativeKind::Image)),
        "image/gif" => Some(("image/gif", NativeKind::Image)),
        "image/webp" => Some(("image/webp", NativeKind::Image)),
        "application/pdf" => Some(("application/pdf", NativeKind::Pdf)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mime_types_are_normalised() {
        assert_eq!(
            native_kind("Image/JPG; q=1"),
            Some(("image/jpeg", NativeKind::Image))
        );
        assert_eq!(
            native_kind("application/pdf"),
            Some(("application/pdf", NativeKind::Pdf))
        );
        assert_eq!(native_kind("text/plain"), None);
        assert_eq!(native_kind(""), None);
    }
}
