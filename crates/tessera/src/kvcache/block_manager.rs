//! Placeholder: the block manager lands from its own branch.

/// A sequence id.
pub type SeqId = u64;
/// A physical page id.
pub type PageId = u32;

/// A device page copy the caller must issue (copy-on-write).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageCopy {
    pub src: PageId,
    pub dst: PageId,
}
