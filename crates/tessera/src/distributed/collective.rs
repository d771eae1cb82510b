//! The collective operations the distributed solver is written against ([`Collective`]), and
//! an in-process implementation for the CPU ([`LocalGroup`]): ranks are threads of one process
//! that share a buffer and a barrier.
//!
//! The GPU implementation is [`Communicator`](super::Communicator) (NCCL).

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// A group of `size()` ranks that sum values together. Every rank of the group must make the
/// same calls in the same order with the same lengths (as with NCCL, MPI); a rank that stops
/// calling leaves the others waiting (or, for [`LocalGroup`], failing after its timeout).
pub trait Collective {
    /// This rank, `0..size()`.
    fn rank(&self) -> usize;
    /// The number of ranks, at least 1.
    fn size(&self) -> usize;
    /// In place: `values` becomes the element-wise sum over the ranks of their `values`, and
    /// every rank gets the same bits. For small host values (scalars, a validation table); the
    /// GPU implementation copies them through the device.
    fn all_reduce_sum_host(&self, values: &mut [f64]) -> Result<()>;
}

/// How long a [`LocalCollective`] waits for the other ranks of its group before it gives up
/// with an error (a rank stuck or gone without dropping its member), unless changed with
/// [`LocalGroup::with_timeout`]. Far above any wait of a balanced solve (the ranks' work between
/// two collectives differs by a fraction of one local product).
pub const LOCAL_TIMEOUT: Duration = Duration::from_secs(300);

/// An in-process group of `size` ranks (threads): [`LocalGroup::new`] returns one
/// [`LocalCollective`] per rank, to be moved into one thread each.
///
/// Sums are deterministic: every rank adds the ranks' contributions itself, in rank order
/// (`((v_0 + v_1) + v_2) + ...`, starting from rank 0's value, so a group of one returns its
/// values unchanged), from the same shared copy, so all ranks get the same bits. A call whose
/// length differs between ranks is an error on every rank. A rank whose [`LocalCollective`] is
/// dropped (returned, or panicked) while others wait makes their calls fail instead of hang.
pub struct LocalGroup;

impl LocalGroup {
    /// One member per rank of a group of `size` ranks (>= 1), waiting at most
    /// [`LOCAL_TIMEOUT`] for each other.
    #[allow(clippy::new_ret_no_self)] // a group is only its members
    pub fn new(size: usize) -> Result<Vec<LocalCollective>> {
        Self::with_timeout(size, LOCAL_TIMEOUT)
    }

    /// [`LocalGroup::new`] with another timeout.
    pub fn with_timeout(size: usize, timeout: Duration) -> Result<Vec<LocalCollective>> {
        if size == 0 {
            return Err(Error::invalid("size", "is 0; a group has at least one rank"));
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                arrived: 0,
                generation: 0,
                left: None,
                slots: vec![Vec::new(); size],
            }),
            turn: Condvar::new(),
            size,
            timeout,
        });
        Ok((0..size)
            .map(|rank| LocalCollective {
                shared: shared.clone(),
                rank,
            })
            .collect())
    }
}

/// One rank of a [`LocalGroup`].
pub struct LocalCollective {
    shared: Arc<Shared>,
    rank: usize,
}

struct Shared {
    state: Mutex<State>,
    turn: Condvar,
    size: usize,
    timeout: Duration,
}

struct State {
    /// Ranks waiting at the current barrier.
    arrived: usize,
    /// Barriers completed so far.
    generation: u64,
    /// The first rank that left the group (dropped its member), if any.
    left: Option<usize>,
    /// Each rank's contribution to the current sum.
    slots: Vec<Vec<f64>>,
}

impl std::fmt::Debug for LocalCollective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCollective")
            .field("rank", &self.rank)
            .field("size", &self.shared.size)
            .finish()
    }
}

impl LocalCollective {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until every rank has arrived here (a reusable barrier), or fails when a rank has
    /// left the group or the timeout passed.
    fn barrier(&self) -> Result<()> {
        let mut st = self.lock();
        if let Some(r) = st.left {
            return Err(left_error(self.rank, r));
        }
        let generation = st.generation;
        st.arrived += 1;
        if st.arrived == self.shared.size {
            st.arrived = 0;
            st.generation += 1;
            self.shared.turn.notify_all();
            return Ok(());
        }
        let deadline = Instant::now() + self.shared.timeout;
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Unsupported(format!(
                    "local collective: rank {} waited {:?} for the other ranks of its group of {}",
                    self.rank, self.shared.timeout, self.shared.size
                )));
            }
            let (guard, _) = self
                .shared
                .turn
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner());
            st = guard;
            if st.generation != generation {
                return Ok(());
            }
            if let Some(r) = st.left {
                return Err(left_error(self.rank, r));
            }
        }
    }
}

fn left_error(rank: usize, left: usize) -> Error {
    Error::Unsupported(format!(
        "local collective: rank {rank} is waiting for rank {left}, which has left the group (returned or failed)"
    ))
}

impl Drop for LocalCollective {
    fn drop(&mut self) {
        let mut st = self.lock();
        st.left.get_or_insert(self.rank);
        self.shared.turn.notify_all();
    }
}

impl Collective for LocalCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    fn all_reduce_sum_host(&self, values: &mut [f64]) -> Result<()> {
        self.lock().slots[self.rank] = values.to_vec();
        self.barrier()?;
        // Every rank reads the same slots and adds them in rank order: the same bits everywhere.
        let mismatch = {
            let st = self.lock();
            match st.slots.iter().position(|s| s.len() != values.len()) {
                Some(r) => Some((r, st.slots[r].len())),
                None => {
                    values.copy_from_slice(&st.slots[0]);
                    for slot in &st.slots[1..] {
                        values.iter_mut().zip(slot).for_each(|(v, s)| *v += s);
                    }
                    None
                }
            }
        };
        // Nobody writes the next contribution before every rank has read this one.
        self.barrier()?;
        match mismatch {
            None => Ok(()),
            Some((r, len)) => Err(Error::invalid(
                "values",
                format!(
                    "rank {} gave {} values but rank {r} gave {len}; every rank must sum the same length",
                    self.rank,
                    values.len()
                ),
            )),
        }
    }
}
