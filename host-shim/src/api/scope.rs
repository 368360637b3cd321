//! Scopes: where collectives run, holding the windows they use until every stream they were
//! enqueued on has run them.

use super::{Comm, Element, ReduceOp, Result, Window};
use crate::abi::symmStream_t;
use crate::error::Error;
use crate::group::entry::{CollectiveArgs, all_to_all_v_call, collective_call, refused_collective};
use crate::plan::Collective;
use std::cell::RefCell;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;

/// A CUDA stream collectives are enqueued on: one this API made ([`Stream::new`], destroyed
/// when dropped), the default stream, or the caller's ([`Stream::from_raw`]). On the host
/// backend a call completes before it returns, and the stream orders nothing.
pub struct Stream {
    raw: u64,
    /// The rank whose device owns a stream this API made (destroyed on drop).
    owner: Option<Arc<crate::comm::Comm>>,
}

impl Stream {
    /// A new non-blocking stream on `comm`'s device (several ranks of one device, each driven by
    /// its own thread, need one each: the default stream would serialize their kernels).
    pub fn new(comm: &Comm) -> Result<Stream> {
        let c = &comm.inner;
        let raw = c
            .clique
            .backend
            .create_stream(c.device)
            .map_err(|e| comm.record(e.in_function("Stream::new")))?;
        Ok(Stream {
            raw,
            owner: (raw != 0).then(|| c.clone()),
        })
    }

    /// The default stream (CUDA's legacy stream). One thread per rank with several ranks on
    /// one device needs a [`Stream::new`] per rank instead (the library says so).
    pub fn default_stream() -> &'static Stream {
        static DEFAULT: Stream = Stream {
            raw: 0,
            owner: None,
        };
        &DEFAULT
    }

    /// A stream of the C ABI (a `CUstream`), not destroyed by this API.
    ///
    /// # Safety
    /// `stream` is NULL or a live stream of the current CUDA context of the ranks it is used
    /// with, and stays live while the returned value does.
    pub unsafe fn from_raw(stream: symmStream_t) -> Stream {
        Stream {
            raw: stream as u64,
            owner: None,
        }
    }

    /// The stream as the C ABI names it.
    pub fn as_raw(&self) -> symmStream_t {
        self.raw as symmStream_t
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Some(c) = &self.owner {
            // Its work first: a stream is destroyed at once even when work is queued on it.
            let _ = c.clique.backend.synchronize_stream(c.device, self.raw);
            let _ = c.clique.backend.destroy_stream(c.device, self.raw);
        }
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stream({:#x})", self.raw)
    }
}

/// Where collectives run (see [`scope`]). Windows enter it with [`Scope::bind`].
pub struct Scope<'s, 'env: 's> {
    /// Every (rank, stream) a window was bound on: synchronized when the scope ends.
    streams: RefCell<Vec<(Arc<crate::comm::Comm>, u64)>>,
    /// Every (rank, context address, stream) of a window bound in the scope: what a launch of
    /// a user's kernel may take.
    contexts: RefCell<Vec<(Arc<crate::comm::Comm>, u64, u64)>>,
    scope: PhantomData<&'s mut &'s ()>,
    env: PhantomData<&'env mut &'env ()>,
}

/// Run `body` with a [`Scope`], and return once every stream of every window bound in it has
/// run the work enqueued on it (also when `body` panics: the panic goes on after that). The
/// windows stay borrowed until then, so no code outside the scope reads, writes, deregisters
/// or frees a window a collective may still use; `std::mem::forget` of a [`Bound`] ends no
/// borrow, since the borrow is the scope's. Then each rank's failure, if any, is its error
/// (a peer's timeout or failure seen by work that ran after its call returned).
///
/// A scope does not start inside a [`super::group`] (its calls would run at the group's end,
/// after the scope): make the group inside the scope.
///
/// Under CUDA graph capture a scope cannot end while a stream it synchronizes is capturing:
/// end the capture inside the scope. The captured graph holds the windows' addresses, so
/// launching it after the windows are dropped is the caller's responsibility (as for any
/// graph).
pub fn scope<'env, R>(body: impl for<'s> FnOnce(&'s Scope<'s, 'env>) -> R) -> Result<R> {
    if crate::group::active() {
        // Its calls would run at the group's end, after the scope released the windows.
        return Err(Error::invalid_usage(
            "inside a group: the scope's calls would run at the group's end, after the scope \
             released its windows; make the group inside the scope",
        )
        .in_function("scope"));
    }
    let scope = Scope {
        streams: RefCell::new(Vec::new()),
        contexts: RefCell::new(Vec::new()),
        scope: PhantomData,
        env: PhantomData,
    };
    /// Synchronizes the scope's streams when `body` unwinds.
    struct SynchronizeOnUnwind<'a, 's, 'env>(&'a Scope<'s, 'env>, bool);
    impl Drop for SynchronizeOnUnwind<'_, '_, '_> {
        fn drop(&mut self) {
            if self.1 {
                let _ = self.0.synchronize();
            }
        }
    }
    let mut guard = SynchronizeOnUnwind(&scope, true);
    let value = body(&scope);
    guard.1 = false;
    scope.synchronize()?;
    Ok(value)
}

impl<'s, 'env> Scope<'s, 'env> {
    /// Bind `window` to this scope for the scope's whole life, its collectives enqueued on
    /// `stream` (borrowed as long): the window is then used only through the returned
    /// [`Bound`].
    pub fn bind<T: Element>(
        &'s self,
        window: &'s mut Window<'_, T>,
        stream: &'s Stream,
    ) -> Bound<'s, T> {
        let comm = window.comm();
        let mut streams = self.streams.borrow_mut();
        if !streams
            .iter()
            .any(|(c, s)| Arc::ptr_eq(c, &comm.inner) && *s == stream.raw)
        {
            streams.push((comm.inner.clone(), stream.raw));
        }
        drop(streams);
        if let Some(context) = context_of(comm, window.as_ptr(), window.len() * size_of::<T>()) {
            self.contexts
                .borrow_mut()
                .push((comm.inner.clone(), context, stream.raw));
        }
        Bound {
            comm,
            address: window.as_ptr(),
            len: window.len(),
            stream: stream.raw,
            borrow: PhantomData,
        }
    }

    /// The context addresses of the windows of `comm` bound in this scope, each with the
    /// stream it was bound on.
    pub(super) fn bound_contexts(&self, comm: &Comm) -> Vec<(u64, u64)> {
        self.contexts
            .borrow()
            .iter()
            .filter(|(c, _, _)| Arc::ptr_eq(c, &comm.inner))
            .map(|(_, context, stream)| (*context, *stream))
            .collect()
    }

    /// Wait for every stream bound in the scope, then look for each rank's failure.
    fn synchronize(&self) -> Result<()> {
        let streams = self.streams.borrow();
        let mut first = None;
        for (comm, stream) in streams.iter() {
            let synchronized = comm
                .clique
                .backend
                .synchronize_stream(comm.device, *stream)
                .and_then(|()| crate::comm::failure::check(comm));
            if let Err(e) = synchronized {
                comm.set_last_error(&e.message);
                first.get_or_insert(e.in_function("scope"));
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// All-reduce: every rank's `send` reduced with `op` into every rank's `recv` (the same
    /// length; in place when they are one span). As `symmAllReduce`.
    pub fn all_reduce<T: Element>(
        &self,
        send: Span<'_, T>,
        recv: Span<'_, T>,
        op: ReduceOp,
    ) -> Result<()> {
        let name = "Scope::all_reduce";
        let comm = same_rank(name, &[send, recv])?;
        if recv.len != send.len {
            return Err(refuse(
                comm,
                name,
                format!(
                    "recv holds {} elements and send {}: an all-reduce needs the same number",
                    recv.len, send.len
                ),
            ));
        }
        run(
            Collective::AllReduce,
            name,
            Some(send),
            Some(recv),
            send.len,
            Some(op),
            0,
        )
    }

    /// Reduce: every rank's `send` reduced with `op` into `recv` of rank `root` (`None` on the
    /// other ranks, where it is not used). As `symmReduce`.
    pub fn reduce<T: Element>(
        &self,
        send: Span<'_, T>,
        recv: Option<Span<'_, T>>,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let name = "Scope::reduce";
        let comm = rooted(
            name,
            root,
            send.comm,
            Some(send),
            recv,
            send.len,
            ("recv", "receives"),
        )?;
        let recv = used_on_root(comm, root, recv);
        run(
            Collective::Reduce,
            name,
            Some(send),
            recv,
            send.len,
            Some(op),
            root,
        )
    }

    /// Broadcast: rank `root`'s `send` (`None` on the other ranks) into every rank's `recv`.
    /// As `symmBroadcast`.
    pub fn broadcast<T: Element>(
        &self,
        send: Option<Span<'_, T>>,
        recv: Span<'_, T>,
        root: usize,
    ) -> Result<()> {
        let name = "Scope::broadcast";
        let comm = rooted(
            name,
            root,
            recv.comm,
            Some(recv),
            send,
            recv.len,
            ("send", "sends"),
        )?;
        let send = used_on_root(comm, root, send);
        run(
            Collective::Broadcast,
            name,
            send,
            Some(recv),
            recv.len,
            None,
            root,
        )
    }

    /// All-gather: every rank's `send` into every rank's `recv`, rank `r`'s at element
    /// `r · send.len()` (`recv` holds `size() · send.len()`). As `symmAllGather`.
    pub fn all_gather<T: Element>(&self, send: Span<'_, T>, recv: Span<'_, T>) -> Result<()> {
        let name = "Scope::all_gather";
        let comm = same_rank(name, &[send, recv])?;
        whole_of(comm, name, ("recv", recv.len), ("send", send.len))?;
        run(
            Collective::AllGather,
            name,
            Some(send),
            Some(recv),
            send.len,
            None,
            0,
        )
    }

    /// Reduce-scatter: segment `r` of every rank's `send` reduced with `op` into rank `r`'s
    /// `recv` (`send` holds `size() · recv.len()`). As `symmReduceScatter`.
    pub fn reduce_scatter<T: Element>(
        &self,
        send: Span<'_, T>,
        recv: Span<'_, T>,
        op: ReduceOp,
    ) -> Result<()> {
        let name = "Scope::reduce_scatter";
        let comm = same_rank(name, &[send, recv])?;
        whole_of(comm, name, ("send", send.len), ("recv", recv.len))?;
        run(
            Collective::ReduceScatter,
            name,
            Some(send),
            Some(recv),
            recv.len,
            Some(op),
            0,
        )
    }

    /// All-to-all: segment `p` of every rank's `send` into segment `r` of rank `p`'s `recv`,
    /// `r` the sender (both hold `size()` segments of the same length). As `symmAlltoAll`.
    pub fn all_to_all<T: Element>(&self, send: Span<'_, T>, recv: Span<'_, T>) -> Result<()> {
        let name = "Scope::all_to_all";
        let comm = same_rank(name, &[send, recv])?;
        let n = comm.size();
        if send.len != recv.len || !send.len.is_multiple_of(n) {
            return Err(refuse(
                comm,
                name,
                format!(
                    "send holds {} elements and recv {}: an all-to-all needs the same number, a \
                 multiple of the {n} ranks",
                    send.len, recv.len
                ),
            ));
        }
        run(
            Collective::AllToAll,
            name,
            Some(send),
            Some(recv),
            send.len / n,
            None,
            0,
        )
    }

    /// All-to-all-v with its counts in device memory (PyTorch SymmMem's `all_to_all_vdev`),
    /// as `symmAlltoAllvDevice`: no host synchronization. `counts` is a table of `3 × size()`
    /// elements: row 0, written before the call (by an earlier kernel on the stream, or from
    /// the host), holds how many elements this rank sends to each rank, its segments packed
    /// in rank order in `send`; the call writes row 1 (the elements received from each rank)
    /// and row 2 (where each rank's segment starts in `recv`, packed in rank order).
    /// `send.len()` and `recv.len()` are the bounds the counts are held to, the same on every
    /// rank; `recv` and `counts` are at the same offsets of the same windows on every rank.
    /// Counts that are negative or overrun a bound are refused on every rank before anything
    /// is copied, and the communicator is failed with that cause.
    pub fn all_to_all_v<T: Element>(
        &self,
        send: Span<'_, T>,
        recv: Span<'_, T>,
        counts: Span<'_, i64>,
    ) -> Result<()> {
        let name = "Scope::all_to_all_v";
        let comm = same_rank(name, &[send, recv])?;
        if !Arc::ptr_eq(&counts.comm.inner, &comm.inner) {
            return Err(refuse(
                comm,
                name,
                format!(
                    "counts belongs to another communicator (its rank {} of {}) than send (rank \
                     {} of {}): a call's spans are one rank's of one communicator",
                    counts.comm.rank(),
                    counts.comm.size(),
                    comm.rank(),
                    comm.size()
                ),
            ));
        }
        if counts.stream != send.stream {
            return Err(refuse(
                comm,
                name,
                format!(
                    "counts is bound on stream {:#x} and send on {:#x}: a call runs on one stream",
                    counts.stream, send.stream
                ),
            ));
        }
        let n = comm.size();
        if Some(counts.len) != n.checked_mul(3) {
            return Err(refuse(
                comm,
                name,
                format!(
                    "counts holds {} elements: the table holds 3 rows of {n} (the ranks)",
                    counts.len
                ),
            ));
        }
        all_to_all_v_call(
            &comm.inner,
            (send.address, send.len),
            (recv.address, recv.len),
            counts.address,
            T::DATA_TYPE as i32,
            send.stream,
        )
        .map_err(|e| comm.record(e.in_function(name)))
    }

    /// Gather: every rank's `send` into `recv` of rank `root` (`None` on the other ranks), rank
    /// `i`'s at element `i · send.len()`. As `symmGather`.
    pub fn gather<T: Element>(
        &self,
        send: Span<'_, T>,
        recv: Option<Span<'_, T>>,
        root: usize,
    ) -> Result<()> {
        let name = "Scope::gather";
        let comm = rooted(
            name,
            root,
            send.comm,
            Some(send),
            recv,
            0,
            ("recv", "receives"),
        )?;
        if let (true, Some(r)) = (comm.rank() == root, recv) {
            whole_of(comm, name, ("recv", r.len), ("send", send.len))?;
        }
        let recv = used_on_root(comm, root, recv);
        run(
            Collective::Gather,
            name,
            Some(send),
            recv,
            send.len,
            None,
            root,
        )
    }

    /// Scatter: segment `i` of rank `root`'s `send` (`None` on the other ranks) into rank
    /// `i`'s `recv`. As `symmScatter`.
    pub fn scatter<T: Element>(
        &self,
        send: Option<Span<'_, T>>,
        recv: Span<'_, T>,
        root: usize,
    ) -> Result<()> {
        let name = "Scope::scatter";
        let comm = rooted(
            name,
            root,
            recv.comm,
            Some(recv),
            send,
            0,
            ("send", "sends"),
        )?;
        if let (true, Some(s)) = (comm.rank() == root, send) {
            whole_of(comm, name, ("send", s.len), ("recv", recv.len))?;
        }
        let send = used_on_root(comm, root, send);
        run(
            Collective::Scatter,
            name,
            send,
            Some(recv),
            recv.len,
            None,
            root,
        )
    }

    /// Send `span` to rank `peer`: pairs with `peer`'s next [`Scope::recv`] from this rank,
    /// which must have the same length. As `symmSend`; inside a [`super::group`] a rank's
    /// sends and receives run together, in any order between the ranks.
    pub fn send<T: Element>(&self, span: Span<'_, T>, peer: usize) -> Result<()> {
        point_to_point("Scope::send", true, span, peer)
    }

    /// Receive into `span` from rank `peer`. As `symmRecv`.
    pub fn recv<T: Element>(&self, span: Span<'_, T>, peer: usize) -> Result<()> {
        point_to_point("Scope::recv", false, span, peer)
    }
}

/// A window bound to a [`Scope`] (see [`Scope::bind`]): the spans of it that collectives take.
pub struct Bound<'s, T: Element> {
    comm: &'s Comm,
    address: u64,
    len: usize,
    stream: u64,
    borrow: PhantomData<&'s mut [T]>,
}

impl<'s, T: Element> Bound<'s, T> {
    /// The rank the window belongs to.
    pub(super) fn comm(&self) -> &'s Comm {
        self.comm
    }

    /// The stream the window is bound on.
    pub(super) fn stream_raw(&self) -> u64 {
        self.stream
    }

    /// The device address of this rank's context of the window (0 if it has none: never, for
    /// a window of the Rust API, whose registration completes before it is returned).
    pub(super) fn context_address(&self) -> u64 {
        context_of(self.comm, self.address, self.len * size_of::<T>()).unwrap_or(0)
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `false`: a window holds at least one element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The whole window.
    pub fn all(&self) -> Span<'_, T> {
        self.at(0, self.len)
    }

    /// Elements `range` of the window.
    pub fn span(&self, range: Range<usize>) -> Result<Span<'_, T>> {
        if range.start > range.end || range.end > self.len {
            return Err(self.comm.record(
                Error::invalid_argument(format!(
                    "elements {range:?}: the window holds {}",
                    self.len
                ))
                .in_function("Bound::span"),
            ));
        }
        Ok(self.at(range.start, range.end - range.start))
    }

    fn at(&self, start: usize, len: usize) -> Span<'_, T> {
        Span {
            comm: self.comm,
            address: self.address + (start * size_of::<T>()) as u64,
            len,
            stream: self.stream,
            element: PhantomData,
        }
    }
}

/// Elements of a [`Bound`] window: what collectives take. Collectives on one bound window run
/// in the order of their stream, so spans are shared borrows (one span may be both a send and
/// a receive: in place).
pub struct Span<'b, T: Element> {
    comm: &'b Comm,
    address: u64,
    len: usize,
    stream: u64,
    element: PhantomData<&'b [T]>,
}

impl<T: Element> Clone for Span<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: Element> Copy for Span<'_, T> {}

impl<T: Element> Span<'_, T> {
    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` for a span of no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Collective `name` of `comm` refused with `message`: the rank's call, refused (see
/// [`refused_collective`]), recorded as the last error.
fn refuse(comm: &Comm, name: &'static str, message: String) -> Error {
    let error = Error::invalid_argument(message).in_function(name);
    comm.record(refused_collective(&comm.inner, name, error))
}

/// The rank every span belongs to, on one stream.
fn same_rank<'a, T: Element>(name: &'static str, spans: &[Span<'a, T>]) -> Result<&'a Comm> {
    let first = spans[0];
    for span in &spans[1..] {
        if !Arc::ptr_eq(&span.comm.inner, &first.comm.inner) {
            return Err(refuse(
                first.comm,
                name,
                format!(
                    "the spans belong to ranks {} and {} (of different communicators, or of \
                 different ranks): a call's spans are one rank's",
                    first.comm.rank(),
                    span.comm.rank()
                ),
            ));
        }
        if span.stream != first.stream {
            return Err(refuse(
                first.comm,
                name,
                format!(
                    "the spans are bound on streams {:#x} and {:#x}: a call runs on one stream",
                    first.stream, span.stream
                ),
            ));
        }
    }
    Ok(first.comm)
}

/// Check a rooted collective: `root` is a rank, `own` (the span every rank passes) and
/// `on_root` (the root's other span: `what` = its name and what the root does with it) are one
/// rank's, and on the root `on_root` is given (with `len` elements, unless 0).
fn rooted<'a, T: Element>(
    name: &'static str,
    root: usize,
    comm: &'a Comm,
    own: Option<Span<'a, T>>,
    on_root: Option<Span<'_, T>>,
    len: usize,
    (what, does): (&str, &str),
) -> Result<&'a Comm> {
    if root >= comm.size() {
        return Err(refuse(
            comm,
            name,
            format!(
                "root = {root}: must be a rank of the communicator, 0 to {}",
                comm.size() - 1
            ),
        ));
    }
    if comm.rank() != root {
        return Ok(comm);
    }
    let Some(other) = on_root else {
        return Err(refuse(
            comm,
            name,
            format!("{what} is None on the root (rank {root}), which {does} it"),
        ));
    };
    let spans: Vec<Span<'_, T>> = own.into_iter().chain([other]).collect();
    same_rank(name, &spans)?;
    if len != 0 && other.len != len {
        return Err(refuse(
            comm,
            name,
            format!(
                "{what} holds {} elements and the other span {len}: they must hold the same number",
                other.len
            ),
        ));
    }
    Ok(comm)
}

/// The root's span, `None` off the root (not used there).
fn used_on_root<'a, T: Element>(
    comm: &Comm,
    root: usize,
    span: Option<Span<'a, T>>,
) -> Option<Span<'a, T>> {
    span.filter(|_| comm.rank() == root)
}

/// `whole` holds `size()` times `part` elements.
fn whole_of(
    comm: &Comm,
    name: &'static str,
    (whole, w): (&str, usize),
    (part, p): (&str, usize),
) -> Result<()> {
    let n = comm.size();
    if p.checked_mul(n) != Some(w) {
        return Err(refuse(
            comm,
            name,
            format!(
                "{whole} holds {w} elements and {part} {p}: {whole} must hold {n} (the ranks) times \
             {part}"
            ),
        ));
    }
    Ok(())
}

/// Run `collective` through the entry the C ABI uses.
fn run<T: Element>(
    collective: Collective,
    name: &'static str,
    send: Option<Span<'_, T>>,
    recv: Option<Span<'_, T>>,
    count: usize,
    op: Option<ReduceOp>,
    root: usize,
) -> Result<()> {
    let span = send.or(recv).expect("a collective has a span");
    let comm = span.comm;
    let args = CollectiveArgs {
        send: send.map_or(0, |s| s.address),
        recv: recv.map_or(0, |s| s.address),
        count,
        datatype: T::DATA_TYPE as i32,
        op: op.map_or(0, |o| o.to_raw() as i32),
        root: root as i32,
    };
    collective_call(&comm.inner, collective, name, args, span.stream)
        .map_err(|e| comm.record(e.in_function(name)))
}

/// A send (`send`) or receive of `span` with `peer`.
fn point_to_point<T: Element>(
    name: &str,
    send: bool,
    span: Span<'_, T>,
    peer: usize,
) -> Result<()> {
    let comm = span.comm;
    let call = crate::point_to_point::Call {
        send,
        buffer: span.address,
        count: span.len,
        datatype: T::DATA_TYPE as i32,
        peer: i32::try_from(peer).unwrap_or(i32::MAX),
    };
    crate::group::point_to_point(&comm.inner, call, span.stream)
        .map_err(|e| comm.record(e.in_function(name)))
}

/// The context address of the window of `comm` at `address` holding `bytes`.
fn context_of(comm: &Comm, address: u64, bytes: usize) -> Option<u64> {
    crate::comm::windows::find(&comm.inner.machine(), address, bytes as u64)
        .and_then(|window| window.context().map(|context| context.address))
}
