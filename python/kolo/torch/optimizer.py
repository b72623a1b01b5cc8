"""``DistributedOptimizer``: gradients reduced as backward produces them.

Each parameter's gradient is submitted to kolo's engine from a hook the
moment autograd has accumulated it (``register_post_accumulate_grad_hook``),
so communication overlaps the rest of backward, and gradients that are
ready together are fused into one collective by the engine. ``step()``
waits for the reductions, then runs the wrapped optimizer's step.
"""

import torch

import kolo as _k


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, op, backward_passes_per_step,
                 prescale_factor, postscale_factor, compression):
        super(self.__class__, self).__init__(params)
        all_params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            if any(not isinstance(n, tuple) or len(n) != 2 for n in named):
                raise ValueError("named_parameters must be (name, parameter) pairs, as model.named_parameters() gives")
            names = [n for n, _ in named]
            if len(set(names)) != len(names):
                dup = sorted({n for n in names if names.count(n) > 1})
                raise ValueError(f"named_parameters has duplicate names: {dup}")
            by_id = {id(p): n for n, p in named}
            missing = [i for i, p in enumerate(all_params) if id(p) not in by_id]
            if missing:
                raise ValueError(
                    f"named_parameters does not name the optimizer's parameters at positions {missing}"
                )
        else:
            by_id = {id(p): f"param.{i}" for i, p in enumerate(all_params)}
        if backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be at least 1, not {backward_passes_per_step}")
        self._kolo_names = by_id
        self._kolo_op = op
        self._kolo_scales = (prescale_factor, postscale_factor)
        self._kolo_compression = compression
        self._kolo_passes = backward_passes_per_step
        self._kolo_delay = {id(p): backward_passes_per_step for p in all_params}
        self._kolo_handles = {}
        self._kolo_hooks = []
        self._kolo_params = [p for p in all_params if p.requires_grad]
        for p in self._kolo_params:
            self._kolo_hooks.append(p.register_post_accumulate_grad_hook(self._kolo_ready))

    def _kolo_submit(self, p):
        prescale, postscale = self._kolo_scales
        if self._kolo_passes > 1:
            # The gradient summed over the passes: average over them too.
            prescale = prescale / self._kolo_passes
        handle = _k.allreduce_async(
            p.grad, self._kolo_op, f"grad.{self._kolo_names[id(p)]}", prescale, postscale,
            compression=self._kolo_compression,
        )
        self._kolo_handles[id(p)] = (p, handle)

    def _kolo_ready(self, p):
        key = id(p)
        if key in self._kolo_handles:
            raise AssertionError(
                f"gradient of '{self._kolo_names[key]}' computed twice before step(): "
                "call step() or synchronize() between backward passes, or raise backward_passes_per_step"
            )
        self._kolo_delay[key] -= 1
        if self._kolo_delay[key] == 0:
            self._kolo_submit(p)

    def synchronize(self):
        """Waits for every gradient's reduction. A parameter whose gradient
        backward did not produce on this rank is reduced now (as zeros), so
        that the ranks' submissions always match."""
        for p in self._kolo_params:
            if id(p) not in self._kolo_handles:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                self._kolo_submit(p)
        handles, self._kolo_handles = self._kolo_handles, {}
        for _, handle in handles.values():
            handle.wait()
        for p in self._kolo_params:
            self._kolo_delay[id(p)] = self._kolo_passes

    def step(self, closure=None):
        """Waits for the gradients' reductions, then steps."""
        self.synchronize()
        return super(self.__class__, self).step(closure)

    def zero_grad(self, set_to_none=True):
        """As the wrapped optimizer's, refused while reductions are in
        flight (they write the gradients)."""
        if self._kolo_handles:
            raise AssertionError("zero_grad() while gradients are being reduced: call step() or synchronize() first")
        return super(self.__class__, self).zero_grad(set_to_none)


def DistributedOptimizer(optimizer, named_parameters=None, compression=None,
                         backward_passes_per_step=1, op=_k.Average,
                         gradient_predivide_factor=1.0):
    """Wraps `optimizer` so that ``step()`` applies gradients averaged (or
    reduced by `op`) across all ranks. `named_parameters` (from
    ``model.named_parameters()``) names the reductions (in errors and the
    timeline); without it parameters are named by position.
    `backward_passes_per_step` accumulates that many backward passes
    locally before reducing. `gradient_predivide_factor` splits the
    averaging into a division before the sum and one after (Horovod's).
    `compression` (:class:`kolo.Compression`: ``none``, ``fp16`` or ``bf16``;
    ``None`` is ``none``) makes float32 gradients travel in 16 bits."""
    compression = _k.Compression.none if compression is None else compression
    if compression not in (_k.Compression.none, _k.Compression.fp16, _k.Compression.bf16):
        raise ValueError(
            f"kolo.torch.DistributedOptimizer: unknown compression {compression!r} "
            "(kolo.Compression.none, .fp16 or .bf16)"
        )
    prescale, postscale = 1.0, 1.0
    if gradient_predivide_factor != 1.0:
        if op != _k.Average:
            raise ValueError("gradient_predivide_factor needs op=Average")
        prescale = 1.0 / gradient_predivide_factor
        postscale = gradient_predivide_factor / _k.size()
        op = _k.Sum
    cls = type(
        optimizer.__class__.__name__,
        (optimizer.__class__,),
        dict(_DistributedOptimizer.__dict__),
    )
    return cls(optimizer.param_groups, named_parameters, op, backward_passes_per_step, prescale, postscale,
               compression)
