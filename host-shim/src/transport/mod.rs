//! How ranks of different processes reach each other: the bootstrap (the root every rank
//! joins, and its wire format), a rank's connections to its peers ([`link`]), passing file
//! descriptors between processes ([`fdpass`]), shared memory ([`shm`]) and memory other
//! processes map ([`shareable`]), and other engines' libraries loaded at run time
//! ([`library`]).

pub mod bootstrap;
pub mod fdpass;
pub mod library;
pub mod link;
pub mod shareable;
pub mod shm;
