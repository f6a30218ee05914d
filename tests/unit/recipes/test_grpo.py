"""The GRPO pieces: the exact-match reward, the completion mask, group-relative advantages,
and a policy-gradient step that raises the log-prob of the rewarded completion."""

from __future__ import annotations

import pytest

from services.recipes.programs.lm_data import EOS, PAD, ByteTokenizer

torch = pytest.importorskip("torch")
grpo = pytest.importorskip("services.recipes.programs.grpo")


def ids(text: str, end: bool = True) -> list[int]:
    return [*ByteTokenizer().encode(text), *([EOS] if end else [])]


def test_reward_is_exact_match_up_to_eos() -> None:
    assert grpo.reward([*ids("ABC"), PAD, PAD], "ABC") == 1.0
    assert grpo.reward(ids("ABC", end=False), "ABC") == 0.0  # no EOS: not an answer
    assert grpo.reward([*ids("AB"), 65], "ABC") == 0.0
    assert grpo.reward(ids("ABCD"), "ABC") == 0.0


def test_mask_keeps_tokens_through_the_first_eos() -> None:
    comps = torch.tensor([[65, EOS, PAD, PAD], [65, 66, 67, 68]])
    assert grpo.completion_mask(comps).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]


def test_advantages_are_relative_to_the_group() -> None:
    adv = grpo.advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    assert adv.sum().abs() < 1e-6 and adv[0] > 0 > adv[1]
    assert torch.equal(grpo.advantages(torch.ones(4)), torch.zeros(4))  # nothing to learn


def test_tasks_keep_only_the_kinds_asked() -> None:
    upper = grpo.tasks(50, seed=1, kinds=(3,))
    assert len(upper) == 50 and all(p.startswith("upper ") for p, _ in upper)
    assert all(a == p.split()[1].rstrip(":").upper() for p, a in upper)
    sums = grpo.tasks(20, seed=1, kinds=(0,))
    assert all(int(a) == sum(int(x) for x in p[:-1].split("+")) for p, a in sums)


def test_a_policy_gradient_step_raises_the_rewarded_completion() -> None:
    from services.recipes.programs.lm import build_model

    torch.manual_seed(0)
    model = build_model({"family": "llama", "hidden_size": 32, "intermediate_size": 64,
                         "num_hidden_layers": 1, "num_attention_heads": 2,
                         "num_key_value_heads": 1, "head_dim": 16,
                         "max_position_embeddings": 32})
    prompt = grpo.prompt_ids("upper ab:")
    comps = torch.tensor([ids("AB"), ids("XY")])
    adv = grpo.advantages(torch.tensor([1.0, 0.0]))
    before = grpo.token_logprobs(model, prompt, comps).sum(dim=1).detach()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loss, _ = grpo.group_loss(model, None, prompt, comps, adv, 0.0)
    loss.backward()
    opt.step()
    after = grpo.token_logprobs(model, prompt, comps).sum(dim=1).detach()
    assert after[0] > before[0] and after[1] < before[1]
