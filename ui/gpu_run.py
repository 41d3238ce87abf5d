"""The model work that runs on a ZeroGPU Space's GPU: one whole /generate run, decoded inside the decorated call.

On ZeroGPU a `@gpu` function runs in a worker process: its arguments and everything it yields are pickled, and
nothing it changes in memory comes back. So the function takes plain values (ids, the prompt, DecodeSettings),
builds its own decoder, and yields plain events: the models' step costs (once per pair), then each Round with the
text so far. The main process adds them to the session's RunRecord (ui/session.Session.worker_rounds) and renders them as usual.

Off ZeroGPU `gpu` returns the function unchanged, and the app does not use this path at all unless
SPECDEC_DETACHED=1 asks for it (tests use that to run this code without a Space).
"""

from __future__ import annotations

from ui.zerogpu import gpu  # first: on ZeroGPU `spaces` must be imported before CUDA is touched

from specdec.core.settings import DecodeSettings
from specdec.loop.decoder import SpeculativeDecoder
from specdec.models.pair import load_pair

from .loader import measure_costs

# Longest a run may hold the GPU. The app caps a run at 512 new tokens; the default pair decodes that in well
# under a minute on a ZeroGPU slice, and the first call in a fresh worker also moves the weights to the GPU.
GPU_DURATION_S = 120


@gpu(duration=GPU_DURATION_S)
def decode_rounds(name: str, target: str, draft: str, dtype: str, device: str, prompt, settings: DecodeSettings,
                  measure: bool, history: list[str] = ()):
    """Yield ("costs", StepCosts) first when `measure`, then ("round", Round, text so far) per round. `history`:
    the session's earlier outputs (plain strings), for the suffix drafter.

    load_pair is memoized: in a worker forked from the app, the pair the app loaded is found there, and on
    ZeroGPU `spaces` moves its weights to the GPU.
    """
    pair = load_pair(name, target=target or None, draft=draft or None, dtype=dtype, device=device)
    if measure:
        yield ("costs", measure_costs(pair))
    decoder = SpeculativeDecoder(pair, prompt, settings, history=list(history))
    for rnd in decoder:
        yield ("round", rnd, decoder.text)
