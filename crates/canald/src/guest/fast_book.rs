//! The books of fast connects (protocol §8.10): each guest's table as canald keeps it
//! (which listener each record lists, which tickets it holds) and the tickets granted
//! and not yet used. The rules that change them are `fast`'s (`impl Shared`).
use crate::guest::ports::PortHold;
use canal_abi::fast::{RECORDS, TICKETS};
use canal_abi::{CanalAddr, Region};
use std::collections::HashMap;

/// Tickets canald keeps ready over all of one guest's records (each holds a reserved
/// port: a descriptor of canald's); per record, every place (`TICKETS`).
pub(crate) const READY_PER_GUEST: usize = 16;
/// Tickets out over all guests: their ports are canald's descriptors, which no
/// guest's descriptor quota counts, so many guests together stay within this.
pub(crate) const READY_IN_ALL: usize = 256;

/// A destination as the connecting guest named it, and the local address its
/// connections there speak from as it sees them (None: the destination's address):
/// a record's destination and source in the guest's table. In canald's network both
/// are the host's; in a network's view, the view's (10.0.2.2:H from 10.0.2.15).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Seen {
    pub(crate) dst: CanalAddr,
    pub(crate) src: Option<CanalAddr>,
}

/// A listener listed in a guest's table.
#[derive(Clone, Copy)]
pub(crate) struct Rec {
    pub(crate) lconn: u32,
    pub(crate) lhandle: u32,
    /// The destination as canald connects to it (host address), and as the guest
    /// named it.
    pub(crate) dst: CanalAddr,
    pub(crate) seen: Seen,
    /// The segment id of each ticket canald holds for this record (0: none): ready,
    /// or claimed and not yet marked.
    pub(crate) granted: [u32; TICKETS],
    /// When it was listed or last used (a counter): the record used longest ago
    /// makes way for a new one.
    pub(crate) stamp: u64,
}

/// One guest's table as canald keeps it.
pub(crate) struct Book {
    /// The guest's region (valid until `forget`: the guest is dropped after it).
    pub(crate) region: Region,
    pub(crate) records: [Option<Rec>; RECORDS],
}

/// A ticket granted and not yet marked or taken back.
pub(crate) struct Ticket {
    pub(crate) conn: u32,
    /// Its place in the guest's table (None: the record was withdrawn since; its
    /// mark resets the connection).
    pub(crate) place: Option<(usize, usize)>,
    pub(crate) lconn: u32,
    pub(crate) lhandle: u32,
    pub(crate) dst: CanalAddr,
    pub(crate) seen: Seen,
    pub(crate) hold: PortHold,
}

#[derive(Default)]
pub(crate) struct FastBooks {
    pub(crate) books: HashMap<u32, Book>,
    pub(crate) tickets: HashMap<u32, Ticket>,
    pub(crate) clock: u64,
    /// Some record may have room for more tickets (`refill`).
    pub(crate) dirty: bool,
}

impl FastBooks {
    /// Guest `conn` has FAST_CONNECT: its table is written through `region`.
    pub(crate) fn register(&mut self, conn: u32, region: Region) {
        self.books.insert(
            conn,
            Book {
                region,
                records: [None; RECORDS],
            },
        );
    }
}
