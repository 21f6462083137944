//! Short-circuited connections between co-resident guests (protocol §8): pair segments
//! (`seg`) and the pair arenas that hold them (`arena`), their memory zones (`zones`),
//! direct peer wake-ups (`bells`), the cross-guest barrier (`barrier`), the room rule
//! (`room`), the biased side locks (`sidelock`) and connects with tickets (`fast`).

pub(crate) mod arena;
pub(crate) mod barrier;
pub(crate) mod bells;
pub(crate) mod fast;
pub(crate) mod room;
pub(crate) mod seg;
pub(crate) mod sidelock;
pub(crate) mod zones;
