"""FSDP2 on gloo CPU ranks measured as FSDP2 holds memory under NCCL.

Two things a CPU run adds that a GPU run with NCCL does not, each counted apart by the measuring
harnesses (measure_steps.py, measure_fsdp_tp.py), so that the corpora record what FSDP2 itself
allocates:

- FSDPMemTracker's post-backward wrapper keeps a gradient alive (FSDPPostBackwardProbe);
- gloo's reduce-scatter clones its whole input (gloo_copies_counted, GLOO_COPY).

One more thing is the tracker's own and not gloo's: FSDPMemTracker hooks every module of a
group that ``fully_shard`` was given as several modules (``fully_shard([norm, lm_head])``) as if
each were a group of its own, which changes what FSDP2 holds (FSDPGroupHooksProbe, which
measure_accelerate_steps.py and measure_fsdp_tp.py mix in; it changes nothing for groups of one
module, the only kind measure_steps.py builds).

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


class FSDPGroupHooksProbe:
    """FSDPMemTracker's forward hooks with FSDP2's gating of a multi-module group kept.

    ``fully_shard`` given several modules (accelerate 1.16's ``fsdp2_prepare_model`` shards
    ``[model.norm, lm_head]`` of a Llama, ``[ln_f, wte, lm_head]`` of a GPT-2 with tied
    embeddings as one group) makes one FSDPState for them, whose forward hooks come from
    ``_register_group_forward_hooks`` (torch/distributed/fsdp/_fully_shard/_fsdp_state.py,
    torch 2.15): one handle over a pre-hook and a post-hook on each module, where the post-hook
    runs the full ``FSDPState._post_forward`` (reshard, pre-backward hook on the output) only
    when the group's last module finishes its forward, and only casts the output otherwise.
    ``FSDPMemTracker._instrument_fsdp_module`` (torch/distributed/_tools/fsdp2_mem_tracker.py)
    removes that handle and registers its wrappers of ``_pre_forward``/``_post_forward`` on each
    module of the group, so under the tracker every module runs the full post-forward (reshard,
    pre-backward hook on its output): in backward the group is unsharded, its gradients
    reduce-scattered and it is resharded once per module where FSDP2 does it once per group (the
    tracker also wraps the group's ``pre_backward``/``post_backward`` once per module). What the
    tracker then counts is not the step FSDP2 runs without it: more under Llama's
    [norm, lm_head], less under GPT-2's [ln_f, wte, lm_head].

    For each state of several modules this registers the tracker's wrappers through
    ``_register_group_forward_hooks(state._modules, <wrapped _pre_forward>,
    <wrapped _post_forward>, state._modules_to_run_forward, state._cast_output_dtype)``, as
    ``FSDPState.init`` registers the plain ones, wraps the group's ``pre_backward`` and
    ``post_backward`` once (with the tracker's wrappers, FSDPPostBackwardProbe's where it is
    mixed in), keyed by the group's first module, and on exit puts the grouped plain hooks and
    the methods back. States of one module are left to FSDPMemTracker's own code: while it runs,
    each multi-module state's parameter groups are set aside (its loop skips a state without
    one), so it instruments exactly the single-module states it instruments without this class;
    with no multi-module state nothing is set aside and both methods only call FSDPMemTracker's.
    """

    def _multi_module_states(self):
        from torch.distributed.fsdp import FSDPModule

        states = {}
        for module in self._root_mod.modules():
            if isinstance(module, FSDPModule):
                state = module._get_fsdp_state()
                if len(state._modules) > 1 and state._fsdp_param_group is not None:
                    states.setdefault(id(state), state)
        return list(states.values())

    def _instrument_fsdp_module(self):
        from torch.distributed.fsdp._fully_shard._fsdp_state import _register_group_forward_hooks

        groups = self._multi_module_states()
        self._group_saved_methods = []
        # FSDPMemTracker's loop skips a state without a parameter group: each multi-module
        # state's groups are set aside while it runs, so it instruments exactly the others.
        set_aside = [(state, state._fsdp_param_groups) for state in groups]
        for state, _ in set_aside:
            state._fsdp_param_groups = []
        try:
            super()._instrument_fsdp_module()
        finally:
            for state, param_groups in set_aside:
                state._fsdp_param_groups = param_groups
        for state in groups:
            group = state._fsdp_param_group
            key = state._modules[0]
            state._pre_forward_hook_handle.remove()  # one handle (_MultiHandle) for both
            if state._post_forward_hook_handle is not state._pre_forward_hook_handle:
                state._post_forward_hook_handle.remove()
            self._instrument_fsdp_sharded_params_grads(group)
            handle = _register_group_forward_hooks(
                state._modules, self._fsdp_state_pre_forward(key, state._pre_forward),
                self._fsdp_state_post_forward(key, state._post_forward),
                state._modules_to_run_forward, state._cast_output_dtype)
            state._pre_forward_hook_handle = state._post_forward_hook_handle = handle
            self._group_saved_methods.append((state, group.pre_backward, group.post_backward))
            group.pre_backward = self._fsdp_param_group_pre_backward(key, group.pre_backward)
            group.post_backward = self._fsdp_param_group_post_backward(key, group.post_backward)

    def _deregister_module_and_optimizer_hooks(self):
        from torch.distributed.fsdp._fully_shard._fsdp_state import _register_group_forward_hooks

        super()._deregister_module_and_optimizer_hooks()
        for state, pre_backward, post_backward in getattr(self, "_group_saved_methods", ()):
            state._pre_forward_hook_handle.remove()
            handle = _register_group_forward_hooks(
                state._modules, state._pre_forward, state._post_forward,
                state._modules_to_run_forward, state._cast_output_dtype)
            state._pre_forward_hook_handle = state._post_forward_hook_handle = handle
            group = state._fsdp_param_group
            group.pre_backward, group.post_backward = pre_backward, post_backward
        self._group_saved_methods = []
