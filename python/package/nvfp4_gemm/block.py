"""The whole mixture-of-experts block on the GPU (``nvfp4_gemm::moe_block::ExpertBlock``)."""

from . import _hooks, _native
from . import checkpoint as _checkpoint


def _bytes(t):
    """A tensor's or array's bytes, as stored (a host copy for device tensors)."""
    if hasattr(t, "tobytes") and not hasattr(t, "data_ptr"):
        return t.tobytes()
    return _hooks.host_bytes(t)


def _plan_options(activation, w4a16, dtype, apply_router_weight_on_input, device, stream, activation_epilogue):
    """The block's plan options in the native constructors' order (both take the same tail)."""
    dtype = "bfloat16" if dtype is None else dtype
    return activation, bool(w4a16), dtype, bool(apply_router_weight_on_input), int(device), stream, bool(activation_epilogue)


def _floats(v, n):
    """``n`` floats from a number, a sequence or a tensor (None: 1.0 each)."""
    if v is None:
        return [1.0] * n
    if hasattr(v, "tolist"):
        v = v.reshape(-1).tolist() if hasattr(v, "reshape") else v.tolist()
    if isinstance(v, (int, float)):
        return [float(v)] * n
    return [float(x) for x in v]


class MoEBlock:
    """A mixture-of-experts layer's whole expert block, planned once: routing from the router's
    ``topk_ids``/``topk_weights``, the gate/up GEMM, the activation, the down GEMM and the
    weighted combine (docs/moe-block.md), every size read on the device: no host
    synchronization and no allocation when ``out`` is given, so a call can be captured in a CUDA
    graph (call it once outside capture first).

    The experts as a ModelOpt NVFP4 checkpoint stores them (this rank's slice, experts
    ``first_expert ..``):

    - ``w13``: ``[E, N1, H/2]`` packed e2m1 (``uint8`` or ``float4_e2m1fn_x2``), the gate rows
      then the up rows (``N1 = 2I``; ``I`` rows of W1 alone for ``activation="relu2"``);
      ``w13_scale``: ``[E, N1, H/16]`` e4m3, the plain layout; ``w13_scale_2``: the weight's
      global dequantization scale per expert (``[E]``, a list or one number);
    - ``w2``, ``w2_scale``, ``w2_scale_2``: the same for ``[E, H, I/2]``;
    - ``w13_input_scale``, ``w2_input_scale``: the activations' dequantization scales per expert
      (``[E]``, a list or one number; W4A4: the global scale a token row routed to expert ``e``
      is quantized with for that GEMM, as calibrated); unused with ``w4a16=True``.

    Options: ``top_k``, ``max_tokens`` (the most tokens a call may pass), ``activation``
    (``"silu"``, ``"gelu_tanh"``, ``"relu2"``), ``w4a16`` (bf16/f16 activations times the NVFP4
    weights, prepacked here on the GPU; W4A4 quantizes the activations to NVFP4 on the GPU),
    ``dtype`` (``torch.bfloat16`` default, or ``torch.float16``: the activations, intermediates
    and output), ``apply_router_weight_on_input`` (vLLM's name: the router weight multiplies the
    input instead of the output), ``activation_epilogue`` (W4A4 on sm_90a: the activation and
    the requantization in the first GEMM's epilogue instead of a kernel of their own, the same
    output bit for bit; docs/moe-block.md §10). The weights are copied to the device once, here.
    """

    def __init__(
        self,
        w13,
        w13_scale,
        w13_scale_2,
        w2,
        w2_scale,
        w2_scale_2,
        w13_input_scale=None,
        w2_input_scale=None,
        *,
        top_k,
        max_tokens,
        first_expert=0,
        activation="silu",
        w4a16=False,
        dtype=None,
        apply_router_weight_on_input=False,
        activation_epilogue=False,
        device=None,
        stream=None,
    ):
        experts, n1, half_h = (int(d) for d in w13.shape)
        hidden, intermediate = 2 * half_h, 2 * int(w2.shape[2])
        if device is None:
            get = getattr(w13, "get_device", None)
            device = get() if get is not None and get() >= 0 else _hooks.current_device()
        self.hidden, self.top_k, self.max_tokens, self.experts = hidden, top_k, max_tokens, experts
        self._block = _native.MoeBlock(
            _bytes(w13),
            _bytes(w13_scale),
            _floats(w13_scale_2, experts),
            _bytes(w2),
            _bytes(w2_scale),
            _floats(w2_scale_2, experts),
            _floats(w13_input_scale, experts),
            _floats(w2_input_scale, experts),
            hidden,
            intermediate,
            first_expert,
            top_k,
            max_tokens,
            *_plan_options(activation, w4a16, dtype, apply_router_weight_on_input, device, stream, activation_epilogue),
        )

    @classmethod
    def from_checkpoint(
        cls,
        source,
        prefix,
        *,
        convention="modelopt",
        experts=None,
        projections="w1_w3_w2",
        reconcile="refuse",
        top_k,
        max_tokens,
        activation="silu",
        w4a16=False,
        dtype=None,
        apply_router_weight_on_input=False,
        activation_epilogue=False,
        device=None,
        stream=None,
    ):
        """The block of the MoE layer ``prefix`` (e.g. ``"model.layers.3.mlp"``; its experts'
        tensors are ``{prefix}.experts.{e}.{projection}.…``) from a checkpoint as stored:
        ``source`` a safetensors path, several paths (a sharded checkpoint), safetensors bytes,
        or a state dict of torch tensors (``from_state_dict`` is the same call).
        ``convention``: ``"modelopt"`` (``weight``, ``weight_scale``, ``weight_scale_2``,
        ``input_scale``) or ``"compressed-tensors"`` (``weight_packed``, ``weight_scale``,
        ``weight_global_scale``, ``input_global_scale``: the inverse scales, inverted here);
        ``experts``: this rank's experts (a count or a ``range``; None: all); ``projections``:
        ``"w1_w3_w2"``, ``"gate_up_down"`` or three names; ``reconcile``: w1/w3 global scales
        that differ are refused (``"refuse"``) or brought to the larger one (``"exact"``,
        ``"round"``; docs/checkpoints.md §3). The library's loader checks every tensor (a
        ``ValueError`` names the one at fault); only the layer's tensors are read from files. The
        other options are the constructor's."""
        shards, r = _checkpoint._shards(source, prefix, experts)
        if device is None:
            device = _hooks.current_device()
        self = cls.__new__(cls)
        self._block = _native.MoeBlock.from_checkpoint(
            shards,
            prefix,
            convention,
            r.start,
            len(r),
            _checkpoint._projections(projections),
            reconcile,
            top_k,
            max_tokens,
            *_plan_options(activation, w4a16, dtype, apply_router_weight_on_input, device, stream, activation_epilogue),
        )
        self.hidden, self.top_k, self.max_tokens, self.experts = self._block.hidden, top_k, max_tokens, len(r)
        return self

    @classmethod
    def from_state_dict(cls, state_dict, prefix, **options):
        """:meth:`from_checkpoint` on a state dict of torch tensors (any device; copied to the
        host once), named as the checkpoint names them."""
        return cls.from_checkpoint(state_dict, prefix, **options)

    def __call__(self, hidden_states, topk_weights, topk_ids, *, out=None, stream=None):
        """``y = block(hidden_states)``: ``hidden_states`` ``[T, H]`` (the block's dtype),
        ``topk_weights`` ``[T, top_k]`` (float32 or bfloat16), ``topk_ids`` ``[T, top_k]`` (int32 or
        int64; ids outside this rank's experts, e.g. -1, contribute nothing). Returns ``out``
        (``[T, H]``, new when None)."""
        if out is None:
            out = hidden_states.new_empty(hidden_states.shape)
        return self._block.run(hidden_states, topk_weights, topk_ids, out, stream)


def fused_experts(hidden_states, block, topk_weights, topk_ids, *, out=None, stream=None):
    """The functional form of :class:`MoEBlock` (the argument order of vLLM's ``fused_experts``
    with the planned block in place of the weights)."""
    return block(hidden_states, topk_weights, topk_ids, out=out, stream=stream)


__all__ = ["MoEBlock", "fused_experts"]
