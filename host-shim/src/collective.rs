//! Collectives: validation of a request against the communicator's windows, its plan, and its
//! execution (now, or at the end of the group).

use crate::backend::BackendKind;
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::ffi::types::{symmDataTypeRaw, symmRedOpRaw, symmResult_t};
use crate::group::{self, Deferred};
use crate::plan::{AllReducePlan, Launch, plan_all_reduce};
use crate::window::{self, Window};
use std::sync::Arc;
use symm_device::symmetric::all_reduce::{AllReduceArgs, FLAG_OVERLAP};
use symm_device::{DataType, RedOp};

/// A validated collective, ready to launch once its window is complete.
pub struct Task {
    /// The rank that runs it.
    pub comm: Arc<Comm>,
    /// The window holding the send buffer (its context drives the kernel).
    pub window: Arc<Window>,
    /// The window holding the receive buffer (kept alive while the task is pending).
    pub recv_window: Arc<Window>,
    /// Kernel and shape.
    pub plan: AllReducePlan,
    /// Kernel arguments.
    pub args: AllReduceArgs,
    /// The caller's stream, as an address.
    pub stream: u64,
}

impl Task {
    /// `true` when the backend runs the task synchronously (the host backend), so the tasks of
    /// one group must run on separate threads.
    pub fn runs_to_completion(&self) -> bool {
        self.comm.clique.backend.kind() == BackendKind::Host
    }

    /// Launch the task; on the host backend, report a timed-out peer as `symmTimeout`.
    pub fn execute(&self) -> Result<()> {
        refuse_if_aborted(&self.comm)?;
        let context = self.window.context().ok_or_else(|| {
            Error::invalid_usage("the send window's registration has not completed")
        })?;
        let launch = Launch {
            kernel: self.plan.kernel,
            grid: self.plan.grid,
            block: self.plan.block,
            context: context.address,
            args: self.args,
            stream: self.stream,
        };
        self.comm
            .clique
            .backend
            .launch(&self.comm.resources, &launch)?;
        if self.window.aborted_on_host() {
            let message = format!(
                "rank {}: a peer did not arrive within {} ms; this communicator is aborted",
                self.comm.rank,
                self.comm.clique.timeout.as_millis()
            );
            self.comm.lock().aborted = Some(message.clone());
            return Err(Error::new(symmResult_t::symmTimeout, message));
        }
        Ok(())
    }
}

fn refuse_if_aborted(comm: &Comm) -> Result<()> {
    match &comm.lock().aborted {
        Some(reason) => Err(Error::invalid_usage(format!(
            "the communicator was aborted ({reason}); destroy it"
        ))),
        None => Ok(()),
    }
}

/// Decode a C `symmDataType_t`.
pub fn data_type(raw: symmDataTypeRaw) -> Result<DataType> {
    u32::try_from(raw)
        .ok()
        .and_then(DataType::from_raw)
        .ok_or_else(|| Error::invalid_argument(format!("datatype = {raw} is not a symmDataType_t")))
}

/// Decode a C `symmRedOp_t`.
pub fn red_op(raw: symmRedOpRaw) -> Result<RedOp> {
    u32::try_from(raw)
        .ok()
        .and_then(RedOp::from_raw)
        .ok_or_else(|| Error::invalid_argument(format!("op = {raw} is not a symmRedOp_t")))
}

/// Find the window of `name`'s buffer and check its alignment.
fn window_of(comm: &Comm, name: &str, address: u64, bytes: u64, align: u64) -> Result<Arc<Window>> {
    let window = window::find(comm, address, bytes).ok_or_else(|| {
        Error::invalid_argument(format!(
            "{name} [{address:#x}, +{bytes} bytes) is not inside a window registered on this \
             comm with SYMM_WIN_COLL_SYMMETRIC"
        ))
    })?;
    if !(address - window.base).is_multiple_of(align) {
        return Err(Error::invalid_argument(format!(
            "{name} is at offset {} of its window, not a multiple of the element size {align}",
            address - window.base
        )));
    }
    Ok(window)
}

/// `symmAllReduce`.
#[allow(clippy::too_many_arguments)]
pub fn all_reduce(
    comm: &Arc<Comm>,
    send: u64,
    recv: u64,
    count: usize,
    datatype: symmDataTypeRaw,
    op: symmRedOpRaw,
    stream: u64,
) -> Result<()> {
    let dtype = data_type(datatype)?;
    let op = red_op(op)?;
    if send == 0 {
        return Err(Error::invalid_argument("sendbuff is NULL"));
    }
    if recv == 0 {
        return Err(Error::invalid_argument("recvbuff is NULL"));
    }
    let element = dtype.size_bytes() as u64;
    let bytes = (count as u64)
        .checked_mul(element)
        .filter(|b| send.checked_add(*b).is_some() && recv.checked_add(*b).is_some())
        .ok_or_else(|| {
            Error::invalid_argument(format!("count = {count}: the buffers would overflow"))
        })?;
    refuse_if_aborted(comm)?;
    let plan = plan_all_reduce(dtype, op, count as u64, comm.clique.backend.kind())?;
    let send_window = window_of(comm, "sendbuff", send, bytes, element)?;
    let recv_window = window_of(comm, "recvbuff", recv, bytes, element)?;
    let in_place = send == recv;
    if !in_place && send < recv + bytes && recv < send + bytes {
        return Err(Error::invalid_argument(
            "sendbuff and recvbuff overlap without being equal (in place needs sendbuff == recvbuff)",
        ));
    }
    if count == 0 {
        return Ok(());
    }
    let task = Task {
        comm: comm.clone(),
        args: AllReduceArgs {
            send_offset: send - send_window.base,
            recv_offset: recv.wrapping_sub(send_window.base),
            count: count as u64,
            flags: if in_place { FLAG_OVERLAP } else { 0 },
        },
        window: send_window,
        recv_window,
        plan,
        stream,
    };
    if group::active() {
        group::defer(Deferred::Collective(task));
        Ok(())
    } else {
        task.execute()
    }
}
