//! The request queue: a bounded multi-producer (guest threads) / single-consumer (the
//! host poller) queue of slot indices, after Dmitry Vyukov's bounded MPMC queue.
//!
//! Each cell carries a sequence number. A producer may fill cell `pos & mask` when its
//! sequence equals `pos`; it then publishes `pos + 1`. The consumer takes the cell when
//! its sequence equals `head + 1` and hands it back by writing `head + capacity`.
//! Sequence numbers are `u32` and compared by wrapping difference, so they may wrap.
//!
//! The consumer keeps `head` in its own (host) memory and never reads it from the
//! region: a guest can scribble on cells, which at worst makes the host read a
//! garbage slot index (validated by the caller) or stall this guest's own queue.

use crate::sync::{AtomicU32, Ordering};

/// One queue cell: 8 bytes, little-endian `seq` then `value`.
#[repr(C)]
pub struct QueueCell {
    pub seq: AtomicU32,
    pub value: AtomicU32,
}

impl QueueCell {
    pub fn new(seq: u32) -> Self {
        QueueCell {
            seq: AtomicU32::new(seq),
            value: AtomicU32::new(0),
        }
    }
}

/// Why a push failed.
#[derive(Debug, PartialEq, Eq)]
pub struct QueueFull;

/// Producer side. `tail` is the shared enqueue position (guest-written).
pub struct QueueProducer<'a> {
    cells: &'a [QueueCell],
    tail: &'a AtomicU32,
}

impl<'a> QueueProducer<'a> {
    /// `cells.len()` must be a power of two of at least 2 (checked by the layout).
    pub fn new(cells: &'a [QueueCell], tail: &'a AtomicU32) -> Self {
        debug_assert!(cells.len().is_power_of_two() && cells.len() >= 2);
        QueueProducer { cells, tail }
    }

    /// Appends `value`. Lock-free: a producer only retries when another producer won
    /// the same position.
    pub fn push(&self, value: u32) -> Result<(), QueueFull> {
        let mask = self.cells.len() as u32 - 1;
        let mut pos = self.tail.load(Ordering::Relaxed);
        loop {
            let cell = &self.cells[(pos & mask) as usize];
            // Q1: Acquire pairs with the consumer's Release in Q4, so the cell is free
            // (the consumer finished reading its old value) before we overwrite it.
            let seq = cell.seq.load(Ordering::Acquire);
            let dif = seq.wrapping_sub(pos) as i32;
            if dif == 0 {
                match self.tail.compare_exchange_weak(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        cell.value.store(value, Ordering::Relaxed);
                        // Q2: Release publishes `value`; pairs with Q3.
                        cell.seq.store(pos.wrapping_add(1), Ordering::Release);
                        return Ok(());
                    }
                    Err(now) => pos = now,
                }
            } else if dif < 0 {
                return Err(QueueFull);
            } else {
                pos = self.tail.load(Ordering::Relaxed);
            }
        }
    }
}

/// Consumer side; `head` lives here, in the consumer's private memory.
pub struct QueueConsumer {
    head: u32,
}

impl Default for QueueConsumer {
    fn default() -> Self {
        Self::new()
    }
}

impl QueueConsumer {
    pub fn new() -> Self {
        QueueConsumer { head: 0 }
    }

    /// Takes the next published value, or `None` if the next cell is not published.
    pub fn pop(&mut self, cells: &[QueueCell]) -> Option<u32> {
        let cap = cells.len() as u32;
        let cell = &cells[(self.head & (cap - 1)) as usize];
        // Q3: Acquire pairs with Q2, making `value` visible.
        let seq = cell.seq.load(Ordering::Acquire);
        if seq != self.head.wrapping_add(1) {
            return None;
        }
        let value = cell.value.load(Ordering::Relaxed);
        // Q4: Release hands the cell back to producers one lap later; pairs with Q1.
        cell.seq
            .store(self.head.wrapping_add(cap), Ordering::Release);
        self.head = self.head.wrapping_add(1);
        Some(value)
    }

    /// Whether a value is published at the head (used before sleeping).
    pub fn has_next(&self, cells: &[QueueCell]) -> bool {
        let cap = cells.len() as u32;
        let cell = &cells[(self.head & (cap - 1)) as usize];
        cell.seq.load(Ordering::Acquire) == self.head.wrapping_add(1)
    }
}

/// Initial cell sequence numbers: cell `i` starts at `i`.
pub fn init_cells(cells: &[QueueCell]) {
    for (i, c) in cells.iter().enumerate() {
        c.seq.store(i as u32, Ordering::Relaxed);
        c.value.store(0, Ordering::Relaxed);
    }
}
