"""FSDP2 on gloo CPU ranks measured as FSDP2 holds memory under NCCL.

Two things a CPU run adds that a GPU run with NCCL does not, each counted apart by the measuring
harnesses (measure_steps.py, measure_fsdp_tp.py), so that the corpora record what FSDP2 itself
allocates:

- FSDPMemTracker's post-backward wrapper keeps a gradient alive (FSDPPostBackwardProbe);
- gloo's reduce-scatter clones its whole input (gloo_copies_counted, GLOO_COPY).

filed_as, the category a storage gets when the tracker first sees it, serves measure_steps.py's
DDP buckets too.
"""

import contextlib


@contextlib.contextmanager
def filed_as(tracker, reftype):
    """Files the storages the tracker first sees inside the block under `reftype` (None: the
    tracker's own choice), through the _track override of measure_steps._PeakProbe."""
    if reftype is not None:
        for dev_snap in tracker._curr_mem_snap.values():
            dev_snap.setdefault(reftype, 0)
    saved, tracker._override_reftype = tracker._override_reftype, reftype
    try:
        yield
    finally:
        tracker._override_reftype = saved


GLOO_COPY = "Gloo Reduce-Scatter Copies"  # the tracker's category for them (a reference type)


@contextlib.contextmanager
def gloo_copies_counted(tracker):
    """Files gloo's reduce-scatter copies under GLOO_COPY while the step runs.

    ProcessGroupGloo::_reduce_scatter_base (torch 2.15) goes through
    reduce_scatter_tensor_coalesced, which clones each input whole, all-reduces the clone and,
    when the work is waited on, copies this rank's chunk of it into the output; the clone lives
    until the wait returns. NCCL reduce-scatters the caller's input into the output without a
    tensor from PyTorch's allocator, and the planner predicts NCCL. The tracker first sees the
    clone in the wait (its chunk), inside ``dist.reduce_scatter_single``, FSDP2's reduce-scatter,
    whose input and output exist before the call: every storage first seen inside that call is
    gloo's clone.
    """
    import torch.distributed as dist

    original = dist.reduce_scatter_single

    def reduce_scatter_single(*args, **kwargs):
        with filed_as(tracker, GLOO_COPY):
            return original(*args, **kwargs)

    dist.reduce_scatter_single = reduce_scatter_single
    try:
        yield
    finally:
        dist.reduce_scatter_single = original


class FSDPPostBackwardProbe:
    """FSDPMemTracker's post-backward wrapper without its reference to a gradient.

    FSDPMemTracker (torch 2.15) wraps ``FSDPParamGroup.post_backward`` to label the group's
    unsharded gradients before it and the sharded ones after it; its loop variable keeps the
    group's last unsharded gradient alive through the reduce-scatter, after FSDP2 has dropped it
    (``foreach_reduce`` clears the list once the gradients are copied in). An untracked run holds
    no such reference, so this wrapper labels the same tensors and snapshots at the same points
    from a helper whose locals are gone before FSDP2's post-backward runs.
    """

    def _label_group_grads(self, fsdp_state, sharded):
        from torch.distributed._tools.fsdp2_mem_tracker import _FSDPRefType

        group = fsdp_state._fsdp_param_group
        for fsdp_param in group.fsdp_params if group else ():
            if sharded and fsdp_param.sharded_param.grad is not None:
                self._update_and_maybe_create_winfos(fsdp_param.sharded_param.grad,
                                                     _FSDPRefType.SHARDED_GRAD)
            elif not sharded and fsdp_param._unsharded_param.grad is not None:
                self._update_and_maybe_create_winfos(fsdp_param._unsharded_param.grad,
                                                     _FSDPRefType.UNSHARDED_GRAD,
                                                     update_existing=True)

    def _fsdp_param_group_post_backward(self, fsdp_mod, orig_post_backward):
        from functools import wraps

        from torch.distributed._tools.fsdp2_mem_tracker import _FSDPModState, _FSDPState

        @wraps(orig_post_backward)
        def post_backward(*args, **kwargs):
            fsdp_state = fsdp_mod._get_fsdp_state()
            self._label_group_grads(fsdp_state, sharded=False)
            snapshots = self.memory_tracking[fsdp_mod].snapshots
            snapshots.setdefault(_FSDPModState.BEF_POST_BW, []).append(
                self.get_tracker_snapshot())
            self._fsdp_state = _FSDPState.POST_BW
            orig_post_backward(*args, **kwargs)
            self._label_group_grads(fsdp_state, sharded=True)
            snapshots.setdefault(_FSDPModState.AFT_POST_BW, []).append(
                self.get_tracker_snapshot())

        return post_backward
