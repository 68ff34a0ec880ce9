"""Models with several outputs, some computed from others, and encoder-decoders whose
embedding is one weight held by several modules, one of them never called (user_models.py's
t5, bart, tuple_out, dict_out), in one process: the loss's timing on outputs computed from
others, the node rule for a module that never runs (tied: goes with its callers; untied: named,
with the way out), and the message for state kept across forwards. test_user_models.py trains
these models under every plan kind against one process.
"""

import pytest
import torch
from torch import nn

from user_models import call, t5, tuple_out


# ---- one process: the loss's timing, the node rule, the messages ----------------------------

def quick_profile(model, inputs, **kwargs):
    from hybridplan.profiler import profile_dict
    return profile_dict(model, inputs, warmup=0, repeats=1, verbose=False, batch_sizes=(),
                        **kwargs)


def test_the_loss_is_timed_on_outputs_computed_from_others():
    """The embedding is upstream of the logits: a backward from the loss to both ran the body
    and the head, freeing their graph, and the second repeat failed."""
    from hybridplan.profiler import block_timing
    model, batch, loss_fn = tuple_out()
    inputs, target = batch(4, 0)
    output = call(model, inputs)
    forward_s, backward_s = block_timing.loss_times(output, lambda o: loss_fn(o, target),
                                                    "wall", repeats=2)
    assert forward_s > 0 and backward_s > 0
    assert block_timing.loss_backward_bytes(output, lambda o: loss_fn(o, target)) > 0
    loss_fn(output, target).backward()  # the model's own graph is still whole
    assert model.embed.weight.grad is not None and model.body.weight.grad is not None


def test_a_tied_module_that_never_runs_goes_with_its_callers():
    """T5's `shared` holds the weight encoder.embed_tokens, decoder.embed_tokens and lm_head
    run with: the graph leaves it out, and a plan of that graph is accepted."""
    from hybridplan.executor.checks import check_module
    from hybridplan.executor.plan_spec import parse_plan
    from hybridplan.hand_plans import even_split, hand_plan
    from hybridplan.profiler import block_list
    model, batch, loss_fn = t5()
    inputs, target = batch(2, 0)
    graph = quick_profile(model, inputs, loss_fn=loss_fn, target=target)
    called = {block_list.module_name(n["name"]) for n in graph["nodes"]}
    assert "shared" not in called
    tied, untied = block_list.uncalled_nodes(block_list.select_nodes(model), called)
    assert (tied, untied) == ({"shared": ["decoder.embed_tokens", "encoder.embed_tokens",
                                          "lm_head"]}, [])
    ids = {n["name"]: n["id"] for n in graph["nodes"]}
    assert [t["nodes"] for t in graph["tied_params"]] == [
        [ids["encoder.embed_tokens"], ids["decoder.embed_tokens"], ids["lm_head"]]]
    names = [n["name"] for n in graph["nodes"]]  # what a planned assignment places
    plan = hand_plan(model, mode="placement", dp=1, mp=2, assignment=even_split(names, 2))
    check_module(parse_plan(plan), model)


class Unused(nn.Module):
    """`spare` (parameters of its own) and `stats` (buffers only) never run."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Linear(4, 8), nn.Linear(8, 2)
        self.spare = nn.Linear(8, 8)
        self.stats = nn.BatchNorm1d(8, affine=False)

    def forward(self, x):
        return self.head(self.embed(x))


def test_a_module_that_never_runs_is_named_with_the_way_out():
    from hybridplan.executor.checks import check_module
    from hybridplan.executor.plan_spec import parse_plan
    from hybridplan.hand_plans import even_split, hand_plan
    model, x = Unused(), torch.randn(2, 4)
    with pytest.warns(UserWarning, match=r"profile unused: \['spare', 'stats'\] hold "
                                         r"parameters or buffers but never ran in forward.*"
                                         r"delete it \(del model.<name>\)"):
        graph = quick_profile(model, x)
    names = [n["name"] for n in graph["nodes"]]
    assert names == ["embed", "head"]
    plan = hand_plan(model, mode="placement", dp=1, mp=2, assignment=even_split(names, 2))
    with pytest.raises(ValueError) as e:
        check_module(parse_plan(plan), model)
    assert ("assignment must place every graph node that holds parameters or buffers; missing "
            "2 of Unused: ['spare', 'stats']. A profiled graph holds the modules that ran in "
            "forward; for one that never runs, delete it (del model.<name>)") in str(e.value)
    assert "or tie its parameters to a module that runs" in str(e.value)


def test_state_kept_across_forwards_gets_a_message():
    """The one backward per step cannot reach a freed graph unless the forward reads a tensor
    an earlier step built."""
    class Carry(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.out, self.state = nn.Linear(4, 4), nn.Linear(4, 2), None

        def forward(self, x):
            h = self.fc(x)
            if isinstance(self.state, torch.Tensor):
                h = h + self.state
            self.state = h  # not detached: the next step's backward runs into this one's
            return self.out(h)
    from hybridplan.profiler import profile_dict
    with pytest.raises(ValueError, match=r"^profile: Carry's backward reached a graph an "
                                         r"earlier step already freed: .* store it detached"):
        profile_dict(Carry(), torch.randn(2, 4), warmup=1, repeats=1, verbose=False,
                     batch_sizes=())
