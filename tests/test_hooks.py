"""Hooks run in the workers at their phase of each step; events reach them exactly once, in order."""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import helpers
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import shmpool
from shmpool import Param, hooks


def plain_run(env_id: str, seed: int, actions: list, stop_at_done: bool = True) -> list[np.ndarray]:
    env = gym.make(env_id)
    observations = [env.reset(seed=seed)[0]]
    for action in actions:
        observation, _, terminated, truncated, _ = env.step(action)
        observations.append(observation)
        if stop_at_done and (terminated or truncated):
            break
    return observations


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_action_delay_shifts_actions(env_id: str, pool_name: str) -> None:
    with shmpool.launch(env_id, 3, num_workers=2, name=pool_name, hooks=[hooks.ActionDelay(2, max_steps=4)]) as pool:
        pool.params["action_delay"][2] = 0
        first, _ = pool.reset(seed=4)
        pool.action_space.seed(1)
        actions = [pool.action_space.sample() for _ in range(25)]
        observations = [first] + [pool.step(a)[0] for a in actions]
    for env in range(3):
        own = [a[env] for a in actions]
        delay = 0 if env == 2 else 2
        shifted = [own[0]] * delay + own[: len(own) - delay]
        expected = plain_run(env_id, 4 + env, shifted)
        for t, obs in enumerate(expected):
            np.testing.assert_array_equal(observations[t][env], obs, err_msg=f"env {env} step {t}")


def test_a_users_declaration_of_a_hooks_parameter_may_narrow_it_not_widen_it(pool_name: str) -> None:
    """ActionDelay keeps ``max_steps`` actions: a delay of 8 once failed deep in the step (IndexError), or,
    compiled, delayed by 3 while ``applied`` said 8."""
    delay = hooks.ActionDelay(2, max_steps=3)
    for declared, kept in [
        (Param(2, low=0, high=10, dtype="int64", bind=False), r"high <= 3"),
        (Param(2, high=3, dtype="int64", bind=False), r"low >= 0"),
        (Param(2, low=0, high=3, bind=False), r"dtype int64 and shape \(\)"),
    ]:
        with pytest.raises(
            ValueError, match=rf"params\['action_delay'\] belongs to hook 'ActionDelay': .* keep {kept}"
        ):
            shmpool.launch("Pendulum-v1", 2, name=pool_name, hooks=[delay], params={"action_delay": declared})
    narrowed = {"action_delay": Param(1, low=0, high=2, dtype="int64", bind=False)}
    with shmpool.launch("Pendulum-v1", 2, num_workers=1, name=pool_name, hooks=[delay], params=narrowed) as pool:
        assert pool.params["action_delay"].tolist() == [1, 1]
        with pytest.raises(ValueError, match="action_delay"):
            pool.params.write(None, action_delay=3)  # within the hook's bound, outside the narrowed one


@pytest.mark.parametrize("order", ["reset_hook_first", "delay_first"])
def test_action_delay_never_delivers_the_previous_episodes_actions(order: str, pool_name: str) -> None:
    delay = hooks.ActionDelay(2)
    chain = [helpers.ResetWhereNotResetting(1, at=6), delay] if order == "reset_hook_first" else [delay, hooks.Reset()]
    with shmpool.launch(helpers.EchoActionEnv, 2, num_workers=2, name=pool_name, hooks=chain) as pool:
        pool.reset(seed=0)
        received = []
        for step in range(11):
            if step == 6 and order == "delay_first":
                pool.events.send("Reset", [1])
            received.append(pool.step(np.full((2, 1), float(step)))[0][:, 1].tolist())
    received = np.array(received)
    # Env 0 never resets: a0, a0, a0, a1, a2, ...
    assert received[:, 0].tolist() == [0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]
    # Env 1 resets in place of step 6; its new episode's first action is a7: a7, a7, a7, a8.
    assert received[6, 1] == -1.0
    assert received[7:, 1].tolist() == [7, 7, 7, 8]


def test_reward_scale_and_episode_returns(pool_name: str) -> None:
    with shmpool.launch("CartPole-v1", 4, num_workers=2, name=pool_name, hooks=[hooks.RewardScale()]) as pool:
        pool.params["reward_scale"][:] = [1.0, 0.5, 2.0, -1.0]
        pool.reset(seed=0)
        returns = np.zeros(4)
        for _ in range(60):
            _, rewards, terminations, truncations, infos = pool.step(np.ones(4, int))
            assert set(rewards.tolist()) <= {1.0, 0.5, 2.0, -1.0, 0.0}
            returns += rewards
            if "episode" in infos:
                done = infos["_episode"]
                np.testing.assert_allclose(infos["episode"]["r"][done], returns[done])
                np.testing.assert_allclose(
                    infos["episode"]["r"][done] / infos["episode"]["l"][done], np.array([1.0, 0.5, 2.0, -1.0])[done]
                )
                returns[done] = 0
                returns[done] -= 0  # the next step is the autoreset (reward 0)


def test_observation_and_action_noise_follow_their_params(pool_name: str) -> None:
    noise = [hooks.ObservationNoise(0.0), hooks.ActionNoise(0.0)]
    with shmpool.launch("Pendulum-v1", 3, num_workers=3, name=pool_name, hooks=noise, seed=1) as pool:
        pool.params["observation_noise"][1] = 0.05
        pool.params["action_noise"][2] = 0.5
        observations, _ = pool.reset(seed=3)
        actions = [np.full((3, 1), 0.3, np.float32) for _ in range(10)]
        trajectory = [observations] + [pool.step(a)[0] for a in actions]
    plain = [plain_run("Pendulum-v1", 3 + env, [a[env] for a in actions]) for env in range(3)]
    for t in range(11):
        np.testing.assert_array_equal(trajectory[t][0], plain[0][t])  # std 0: untouched
    deviation = np.abs(np.array([trajectory[t][1] - plain[1][t] for t in range(11)]))
    assert 0.005 < deviation.mean() < 0.15  # observation noise around std 0.05, not compounding
    assert not np.array_equal(trajectory[10][2], plain[2][10])  # action noise changes the dynamics
    np.testing.assert_array_equal(trajectory[0][2], plain[2][0])  # ...but not the reset observation


def step_kicked(env: gym.Env, action: np.ndarray, strengths: tuple[float, ...]) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each strength, what a Pendulum ``env`` returns when its angular velocity is kicked by that
    amount before it steps with ``action``, and the state it ends in; leaves ``env`` in its first state."""
    start = np.array(env.unwrapped.state, dtype=np.float64)
    outcomes = []
    for strength in strengths:
        kicked = start.copy()
        kicked[1] += strength
        env.unwrapped.state = kicked
        observation = env.unwrapped.step(action)[0]
        outcomes.append((observation, np.array(env.unwrapped.state)))
    env.unwrapped.state = start
    return outcomes


def test_noise_streams_of_names_sharing_8_characters_differ(pool_name: str) -> None:
    observations = []
    for suffix in ("Left", "Right"):
        noise = hooks.ObservationNoise(1.0, name=f"ObsNoise{suffix}")
        with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name + suffix, hooks=[noise], seed=0) as pool:
            observations.append(pool.reset()[0])
    plain = SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(2)]).reset(seed=0)[0]
    assert not np.array_equal(observations[0], plain)
    assert not np.allclose(observations[0], observations[1])


def test_perturb_kicks_on_events_and_on_schedule(pool_name: str) -> None:
    kicks = [
        hooks.Perturb(0.0, name="Push"),
        hooks.Perturb(0.2, every=3, param="scheduled_strength", name="Every3"),
    ]
    with shmpool.launch("Pendulum-v1", 2, num_workers=2, name=pool_name, hooks=kicks) as pool:
        pool.params["perturb_strength"][:] = 0.0  # Push kicks only with the strength its events carry
        pool.params["scheduled_strength"][1] = 0.0  # Every3 kicks env 0 by 0.2 and env 1 by nothing
        assert pool.params["scheduled_strength"].tolist() == [0.2, 0.0]
        pool.reset(seed=0)
        zero = np.zeros((2, 1), np.float32)
        references = [gym.make("Pendulum-v1") for _ in range(2)]
        for env, reference in enumerate(references):
            reference.reset(seed=env)
        pool.events.send("Push", [1], [0.7])
        kicked_at: dict[int, list[int]] = {0: [], 1: []}
        for t in range(10):  # the step count of both episodes is t
            observations = pool.step(zero)[0]
            for env, reference in enumerate(references):
                unkicked = step_kicked(reference, zero[env], (0.0,))[0][0]
                strength = 0.7 if (env, t) == (1, 0) else 0.2 if env == 0 and t % 3 == 0 and t > 0 else 0.0
                outcomes = step_kicked(reference, zero[env], (strength, -strength))
                matches = [state for observation, state in outcomes if np.array_equal(observations[env], observation)]
                assert matches, f"env {env} step {t}: not the plain step kicked by +-{strength}"
                reference.unwrapped.state = matches[0]
                if not np.array_equal(observations[env], unkicked):
                    kicked_at[env].append(t)
        # Env 0: the schedule (step counts 3, 6, 9); env 1: the event, at the first step, and nothing else.
        assert kicked_at == {0: [3, 6, 9], 1: [0]}
        with pytest.raises(KeyError, match=r"hooks are \['Push', 'Every3'\]"):
            pool.events.send("Pushh", [1])
    for reference in references:
        reference.close()


@pytest.mark.parametrize("every", [None, 1000])
def test_perturb_does_not_kick_an_env_whose_step_is_a_reset(every: int | None, pool_name: str) -> None:
    """An event for an env whose step is its autoreset (its episode ended the step before) kicks
    nothing: there is no physics step to push, and the push must not land in the new episode."""
    perturb = hooks.Perturb(0.1, every=every, kick=helpers.count_kick)
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, hooks=[perturb], seed=0) as pool:
        pool.reset(seed=0)
        pool.events.send("Perturb", [0, 1])
        pool.step(np.zeros(2, dtype=np.int64))
        assert pool.get_attr("kicks") == (1, 1)
        for _ in range(2000):  # until a step that ends env 0's episode and not env 1's
            _, _, terminations, truncations, _ = pool.step(np.zeros(2, dtype=np.int64))
            if (terminations | truncations).tolist() == [True, False]:
                break
        else:
            pytest.fail("env 0's episode never ended alone")
        pool.events.send("Perturb", [1, 0])
        pool.step(np.zeros(2, dtype=np.int64))  # env 0 resets, env 1 steps
        assert pool.get_attr("kicks") == (1, 2)


def test_due_every_gives_the_rows_at_positive_multiples_on_every_step() -> None:
    """The schedule that lets ``every=`` hooks skip looking at the counts misses no due row: step
    counts rising by one, episodes ending at random, checked against the counts on every step."""
    rng = np.random.default_rng(0)
    ctx = hooks.HookContext(lambda rows: None, lambda names, rows: None)
    counts = np.zeros(6, dtype=np.int64)
    skipped = 0
    for step in range(3000):
        ctx.begin_step(step)
        ctx.begin_phase(counts.tolist(), [False] * 6, [False] * 6, "before_step")
        for every in (50, 7, 3, 1):
            due = ctx.due_every(every)
            assert due.tolist() == np.flatnonzero((counts > 0) & (counts % every == 0)).tolist(), (step, every)
            if every == 50:
                skipped += 0 not in ctx._arrays  # answered without making the counts an array
        # Another phase of the same step (an on_reset after the counts rose) leaves the schedule be.
        ctx.begin_phase((counts + 1).tolist(), [False] * 6, [False] * 6, "on_reset")
        assert ctx.due_every(7).tolist() == np.flatnonzero((counts + 1) % 7 == 0).tolist()
        counts += 1
        counts[rng.random(6) < 0.02] = 0  # episodes end at random
    assert skipped  # steps where no row could be due were answered without reading the counts


def kick_context(envs: list, strength: float) -> hooks.HookContext:
    """A HookContext over ``envs`` alone (no worker), for one step in which every env is kicked."""
    count = len(envs)
    ctx = hooks.HookContext(lambda rows: None, lambda names, rows: None)
    ctx.env_ids, ctx.envs, ctx.seed = np.arange(count), envs, 0
    ctx.applied = {"perturb_strength": np.full(count, strength)}  # type: ignore[assignment]
    ctx.begin_step(0)
    ctx.begin_phase([3] * count, [False] * count, [False] * count, "before_step")
    return ctx


def test_perturb_finds_each_envs_kick_once_and_again_for_a_remade_env() -> None:
    perturb = hooks.Perturb(0.25, every=3)
    envs = [gym.make("CartPole-v1"), gym.make("Acrobot-v1")]
    for env in envs:
        env.reset(seed=0)
    before = [np.array(env.unwrapped.state, dtype=np.float64) for env in envs]
    ctx = kick_context(envs, 0.25)
    perturb.before_step(ctx)
    kicks = [perturb._defaults[row][1] for row in range(2)]
    for env, old, velocities in zip(envs, before, ([1, 3], [2, 3])):
        change = np.array(env.unwrapped.state) - old
        np.testing.assert_allclose(np.abs(change[velocities]), 0.25)
        assert not np.delete(change, velocities).any()  # only the velocities move
    perturb.before_step(ctx)
    assert [perturb._defaults[row][1] for row in range(2)] == kicks  # found once per env
    envs[0] = gym.make("CartPole-v1")  # a rebuilt env (rebuild parameters re-make envs in place)
    envs[0].reset(seed=1)
    old = np.array(envs[0].unwrapped.state, dtype=np.float64)
    perturb.before_step(ctx)
    assert perturb._defaults[0][1] is not kicks[0] and perturb._defaults[1][1] is kicks[1]
    np.testing.assert_allclose(np.abs((np.array(envs[0].unwrapped.state) - old)[[1, 3]]), 0.25)
    assert pickle.loads(pickle.dumps(perturb))._defaults == {}  # shipped without the per-env kicks


def test_perturb_without_a_kick_on_an_env_of_unknown_velocities_fails_the_launch(pool_name: str) -> None:
    """At launch, not at the first kick (which an event may send hours into a run)."""
    with pytest.raises(shmpool.WorkerError, match="failed in hook 'Perturb'.* during launch") as caught:
        shmpool.launch(helpers.PairEnv, 2, num_workers=1, name=pool_name, hooks=[hooks.Perturb(1.0)])
    assert "no default kick for PairEnv" in caught.value.__cause__.text


def test_reset_event_resets_in_place_of_the_step(pool_name: str) -> None:
    with shmpool.launch("CartPole-v1", 4, num_workers=2, name=pool_name, hooks=[hooks.Reset()]) as pool:
        pool.reset(seed=0)
        for _ in range(5):
            pool.step(np.ones(4, int))
        pool.events.send("Reset", [1, 2])
        observations, rewards, terminations, truncations, infos = pool.step(np.ones(4, int))
        assert rewards.tolist() == [1.0, 0.0, 0.0, 1.0]
        assert not terminations[1:3].any() and not truncations[1:3].any()
        assert np.all(np.abs(observations[1:3]) <= 0.05)  # CartPole's reset state
        assert np.any(np.abs(observations[0]) > 0.05)


def test_hooks_later_in_the_chain_see_resets_that_earlier_hooks_asked_for(pool_name: str) -> None:
    chain = [helpers.ResetWhereNotResetting(1, at=3), helpers.SeesResetting()]
    with shmpool.launch(helpers.EchoActionEnv, 3, num_workers=1, name=pool_name, hooks=chain) as pool:
        pool.reset(seed=0)
        seen = [pool.step(np.zeros((3, 1)))[1].tolist() for _ in range(5)]
    assert seen == [[0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 1, 0], [0, 0, 0]]


@pytest.mark.parametrize("engine", ["python", "numba"])
def test_a_reset_request_takes_rows_or_a_mask_alike_on_every_engine(pool_name: str, engine: str) -> None:
    """A boolean mask resets the envs it marks (the Python engine took it for rows 0 and 1); a row
    outside the slot (a negative one would reset an env at its other end) fails, naming the rule."""
    mask = np.array([False, False, True])
    hooks = [helpers.ResetRowsAt([], at=1), helpers.ResetRowsAt(mask, at=2)]  # [], nothing due: no reset
    with shmpool.launch("CartPole-v1", 3, num_workers=1, engine=engine, name=pool_name, hooks=hooks) as pool:
        pool.reset(seed=0)
        for _ in range(3):  # the third step, at global step 2, resets env 2 instead of stepping it
            observations = pool.step(np.zeros(3, np.int64))[0]
        reset_state = np.all(np.abs(observations) <= 0.05, axis=1)  # three pushes left move every other env more
        assert reset_state.tolist() == [False, False, True]
    with shmpool.launch(
        "CartPole-v1", 3, num_workers=1, engine=engine, name=pool_name, hooks=[helpers.ResetRowsAt([-1], at=0)]
    ) as pool:
        pool.reset(seed=0)
        with pytest.raises(shmpool.WorkerError, match=r"request_reset: rows must be row indices of the slot's 3"):
            pool.step(np.zeros(3, np.int64))


def test_resample_redraws_dist_params(pool_name: str) -> None:
    params = {"masscart": Param(dist="uniform", low=0.5, high=2.0, when="reset")}
    with shmpool.launch(
        "CartPole-v1",
        2,
        num_workers=1,
        name=pool_name,
        params=params,
        hooks=[hooks.Resample(["masscart"], every=2)],
        seed=0,
    ) as pool:
        pool.reset()
        values = []
        for _ in range(6):
            pool.step(np.zeros(2, int))
            values.append(pool.applied["masscart"].copy())
        # Redrawn before steps 2 and 4 of the episode (step counts 2, 4): a new value every two steps.
        assert values[0].tolist() == values[1].tolist()
        assert values[1].tolist() != values[2].tolist() and values[2].tolist() == values[3].tolist()
    with pytest.raises(shmpool.WorkerError, match="failed in hook 'Resample'.* during launch") as caught:
        shmpool.launch(
            "CartPole-v1", 2, num_workers=1, name=pool_name, params=params, hooks=[hooks.Resample(["mascart"], every=2)]
        )
    assert "'mascart' is not a dist parameter of this pool; those are ['masscart']" in caught.value.__cause__.text


def test_resample_keeps_a_reset_params_write_for_the_next_reset(pool_name: str) -> None:
    """A ``when="reset"`` write mid-episode waits for each env's next reset: a redraw before then
    draws from the arguments the episode began with."""
    params = {"a": Param(dist="uniform", default={"low": 0.0, "high": 1.0}, low=-10, high=10, when="reset", bind=False)}
    with shmpool.launch(
        helpers.CountingEnv,
        2,
        num_workers=1,
        name=pool_name,
        params=params,
        hooks=[hooks.Resample(["a"], every=2)],
        seed=0,
        env_kwargs={"length": 6},
    ) as pool:
        pool.reset(seed=0)
        pool.params.write(None, a={"low": 5.0, "high": 6.0})
        before, after = [], []
        for step in range(1, 10):
            pool.step(np.ones(2, np.int64))
            (before if step <= 6 else after).append(pool.applied["a"].copy())
    assert len({tuple(values) for values in before}) == 3  # redrawn before steps 3 and 5
    assert all(((values >= 0.0) & (values <= 1.0)).all() for values in before)
    assert all(((values >= 5.0) & (values <= 6.0)).all() for values in after)


def test_hooks_see_param_writes_of_the_same_step(pool_name: str) -> None:
    params = {"a": Param(0.0, low=-10, high=10)}
    with shmpool.launch(
        helpers.PairEnv, 4, num_workers=2, name=pool_name, params=params, hooks=[helpers.SeesParams()]
    ) as pool:
        pool.reset(seed=0)
        for value in (1.0, 2.5, -3.0):
            pool.params["a"][:] = value
            assert pool.step(np.zeros(4, int))[1].tolist() == [value] * 4


def steps_beside_sync(
    hook: object, at: int, change_sync: Callable[[SyncVectorEnv], None], pool_name: str, trainer_slot: bool = False
) -> np.ndarray:
    """Steps 4 CartPoles with ``hook`` and Sync's, which ``change_sync`` changes before step ``at``, with the
    same random actions for 40 steps, asserting the same results at each; returns the last rewards."""
    sync = SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(4)], autoreset_mode=AutoresetMode.SAME_STEP)
    rng = np.random.default_rng(0)
    with shmpool.launch(
        "CartPole-v1",
        4,
        num_workers=1,
        trainer_slot=trainer_slot,
        autoreset_mode=AutoresetMode.SAME_STEP,
        hooks=[hook],
        name=pool_name,
    ) as pool:
        np.testing.assert_array_equal(pool.reset(seed=1)[0], sync.reset(seed=1)[0])
        for t in range(40):
            if t == at:
                change_sync(sync)
            actions = rng.integers(0, 2, 4)
            ours, theirs = pool.step(actions), sync.step(actions)
            for label, a, b in zip(("observations", "rewards", "terminations", "truncations"), ours, theirs):
                np.testing.assert_array_equal(a, b, err_msg=f"step {t} {label}")
    sync.close()
    return ours[1]


@pytest.mark.parametrize("trainer_slot", [False, True])
@pytest.mark.parametrize(
    "change", [helpers.double_rewards_inside, helpers.double_rewards_outside, helpers.double_rewards_by_a_wrapper]
)
@pytest.mark.parametrize("at", [1, 5])  # step 1: gymnasium's checker still checks it, the slot steps the wrappers
def test_a_step_a_hook_patched_or_wrapped_is_what_steps(
    at: int, change: Callable[[list, int], None], trainer_slot: bool, pool_name: str
) -> None:
    """A hook of the user's that patches an env's ``step`` (inside its wrappers or outside them), or puts
    the env in a new wrapper, with no control call: that env steps through it from that step on, as in
    Sync with the same change, and the others as before."""
    hook = helpers.ChangesEnv(at, 2, helpers.OnEnvs(change))
    rewards = steps_beside_sync(hook, at, lambda sync: change(sync.envs, 2), pool_name, trainer_slot)
    assert rewards.tolist() == [1.0, 1.0, 2.0, 1.0]


def test_a_step_a_hook_patched_through_envs_it_held_since_launch_is_what_steps(pool_name: str) -> None:
    """A hook that took ``ctx.envs`` at launch and patches a step later, without reading them again."""
    hook = helpers.ChangesHeldEnvs(7, 2, helpers.double_rewards_inside)
    rewards = steps_beside_sync(hook, 7, lambda sync: helpers.double_rewards_inside(sync.envs, 2), pool_name)
    assert rewards.tolist() == [1.0, 1.0, 2.0, 1.0]


@pytest.mark.parametrize("name", list(helpers.STEPPING_CLASSES))
def test_a_step_a_hook_patched_on_a_class_is_what_steps(name: str, monkeypatch, pool_name: str) -> None:
    """A hook of the user's that patches ``step`` on a class, one of the wrappers the slot steps beneath
    or the env's own: every env steps through it from that step on, as Sync's do with the same patch.
    In a worker process, where the patch stays."""
    kind = helpers.STEPPING_CLASSES[name]
    hook = helpers.ChangesEnv(5, 0, helpers.DoublesRewardsOfClass(name))
    rewards = steps_beside_sync(
        hook, 5, lambda sync: monkeypatch.setattr(kind, "step", helpers.doubled_rewards_method(kind.step)), pool_name
    )
    assert rewards.tolist() == [2.0] * 4


def test_hook_error_names_hook_worker_and_envs(pool_name: str) -> None:
    with shmpool.launch("CartPole-v1", 4, num_workers=2, name=pool_name, hooks=[helpers.Explodes(at=2)]) as pool:
        pool.reset(seed=0)
        pool.step(np.zeros(4, int))
        pool.step(np.zeros(4, int))
        with pytest.raises(
            shmpool.WorkerError, match=r"worker 0 .* failed in hook 'Explodes' \(envs 0\.\.1\)"
        ) as caught:
            pool.step(np.zeros(4, int))
        assert "hook went wrong on purpose" in caught.value.__cause__.text


class _Doubles:
    """Doubles the rewards in place (``*=``: the same array, set back)."""

    def after_step(self, ctx: hooks.HookContext) -> None:
        ctx.rewards *= 2.0


class _AddsOne:
    def after_step(self, ctx: hooks.HookContext) -> None:
        ctx.rewards[:] += 1.0


class _RebindsRewards:
    """Gives ``ctx.rewards`` a new array: the results would never see it, nor would the hooks after it."""

    def after_step(self, ctx: hooks.HookContext) -> None:
        ctx.rewards = ctx.rewards * 2.0


def test_hooks_change_the_results_in_place_and_rebinding_them_is_refused(pool_name: str) -> None:
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, hooks=[_Doubles(), _AddsOne()]) as pool:
        pool.reset(seed=0)
        for _ in range(3):
            assert pool.step(np.zeros(2, int))[1].tolist() == [3.0, 3.0]  # CartPole's 1.0, doubled, plus one
    with shmpool.launch("CartPole-v1", 2, num_workers=1, name=pool_name, hooks=[_RebindsRewards(), _AddsOne()]) as pool:
        pool.reset(seed=0)
        with pytest.raises(shmpool.WorkerError, match="ctx.rewards holds the slot's results: change it in place"):
            pool.step(np.zeros(2, int))


def test_events_at_step_and_full_rings(pool_name: str, tmp_path: Path) -> None:
    with shmpool.launch(
        "CartPole-v1",
        4,
        num_workers=2,
        name=pool_name,
        hooks=[helpers.EventLog(str(tmp_path))],
        event_capacity=3,
        event_payload=2,
    ) as pool:
        pool.reset(seed=0)
        pool.events.send("Log", [3], [1, 1], at_step=4)
        pool.events.send("Log", [0, 3], [2, 2])
        pool.events.send("Log", None, [3, 3])
        with pytest.raises(shmpool.EventQueueFullError, match="worker 1 is full .3 events"):
            pool.events.send("Log", [2], [4, 4])
        started = time.monotonic()
        with pytest.raises(shmpool.EventQueueFullError):
            pool.events.send("Log", [2], [4, 4], wait=0.3)
        assert 0.25 < time.monotonic() - started < 10.0  # waited its timeout, then gave up: no hang
        with pytest.raises(ValueError, match="allows 2"):
            pool.events.send("Log", [0], [1, 2, 3])
        outcome: list[object] = []

        def send_when_there_is_room() -> None:
            try:
                pool.events.send("Log", [2], [4, 4], wait=None)
                outcome.append("sent")
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                outcome.append(exc)

        sender = threading.Thread(target=send_when_there_is_room, daemon=True)
        sender.start()
        sender.join(0.3)
        assert sender.is_alive() and outcome == [], outcome  # the ring is full and nobody steps: it waits
        pool.step(np.zeros(4, int))  # drains the ring
        sender.join(10)
        assert not sender.is_alive() and outcome == ["sent"], outcome
        for _ in range(6):
            pool.step(np.zeros(4, int))
    lines = sorted(
        # numpy 2 writes env ids as np.int64(3), numpy 1 as 3
        re.sub(r"np\.int64\((-?\d+)\)", r"\1", line)
        for file in tmp_path.glob("events-*.txt")
        for line in file.read_text().splitlines()
    )
    assert lines == [
        "1 1 4 [3]",
        "2 2 0 [0]",
        "2 2 0 [3]",
        "3 3 0 [0, 1]",
        "3 3 0 [2, 3]",
        "4 4 1 [2]",
    ]


SENDER = """
import sys, numpy as np, shmpool
name, writer, count, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
after = np.zeros(count, dtype=np.int64)
with shmpool.attach(name, wait=10) as handle:
    print("attached", flush=True)
    for seq in range(count):
        before = handle.global_step
        handle.events.send("Log", [seq % handle.num_envs], [writer, seq, before], wait=None)
        after[seq] = handle.global_step
np.save(out, after)
"""


def test_100k_events_from_two_processes_exactly_once_in_order(pool_name: str, tmp_path: Path) -> None:
    per_writer = 50_000
    with shmpool.launch(
        "CartPole-v1", 4, num_workers=2, name=pool_name, hooks=[helpers.EventLog(str(tmp_path))], event_payload=3
    ) as pool:
        pool.reset(seed=0)
        writers = [
            subprocess.Popen(
                [sys.executable, "-c", SENDER, pool.name, str(w), str(per_writer), str(tmp_path / f"sent{w}.npy")],
                stdout=subprocess.PIPE,
                text=True,
                env=helpers.ENV,
            )
            for w in (1, 2)
        ]
        for writer in writers:
            assert writer.stdout.readline().strip() == "attached"
        deadline = time.monotonic() + 240
        while any(w.poll() is None for w in writers) and time.monotonic() < deadline:
            pool.step(np.zeros(4, int))
        for _ in range(3):
            pool.step(np.zeros(4, int))  # delivers what the last sends queued
        assert [w.wait(10) for w in writers] == [0, 0]
    sent_by = {w: np.load(tmp_path / f"sent{w}.npy") for w in (1, 2)}  # global step once each send returned
    received: dict[int, list[int]] = {1: [], 2: []}
    for file in tmp_path.glob("events-*.txt"):
        per_file: dict[int, list[int]] = {1: [], 2: []}
        for line in file.read_text().splitlines():
            writer, seq, before, delivered = (int(v) for v in line.split()[:4])
            # Delivered at the next step the workers start after the send: between the steps that
            # had been issued before it began and one past those issued when it returned.
            assert before <= delivered <= sent_by[writer][seq] + 1, line
            per_file[writer].append(seq)
        for writer, seqs in per_file.items():
            assert seqs == sorted(seqs)  # in send order per writer (within each worker's ring)
            received[writer] += seqs
    for writer in (1, 2):
        assert sorted(received[writer]) == list(range(per_writer))  # each exactly once


KILLED_SENDER = """
import sys, time, shmpool
with shmpool.attach(sys.argv[1], wait=10) as handle:
    handle.events._lock._acquire(None, lambda: None)   # dies holding the senders' lock
    print("holding", flush=True)
    time.sleep(60)
"""


def test_a_sender_killed_mid_send_does_not_wedge_the_ring(pool_name: str, tmp_path: Path) -> None:
    with shmpool.launch(
        "CartPole-v1", 2, num_workers=1, name=pool_name, hooks=[helpers.EventLog(str(tmp_path))], event_payload=3
    ) as pool:
        pool.reset(seed=0)
        sender = subprocess.Popen(
            [sys.executable, "-c", KILLED_SENDER, pool.name],
            stdout=subprocess.PIPE,
            text=True,
            env=helpers.ENV,
        )
        assert sender.stdout.readline().strip() == "holding"
        sender.kill()
        sender.wait(5)
        started = time.monotonic()
        pool.events.send("Log", [1], [7, 7, 7], wait=30)
        assert time.monotonic() - started < 10.0  # the kernel dropped the dead sender's lock: no waiting it out
        pool.step(np.zeros(2, int))
    assert "7 7 7 0" in "".join(f.read_text() for f in tmp_path.glob("events-*.txt"))


def run_with_events(num_workers: int, name: str) -> list[np.ndarray]:
    chain = [hooks.ObservationNoise(0.02), hooks.ActionDelay(1), hooks.Perturb(0.1, every=7), hooks.Reset()]
    with shmpool.launch("CartPole-v1", 6, num_workers=num_workers, seed=11, name=name, hooks=chain) as pool:
        trajectory = [pool.reset()[0]]
        rng = np.random.default_rng(0)
        for t in range(80):
            if t % 13 == 5:
                pool.events.send("Perturb", rng.integers(0, 6, 2), [0.3])
            if t % 17 == 3:
                pool.events.send("Reset", [int(rng.integers(0, 6))])
            trajectory.append(pool.step(rng.integers(0, 2, 6))[0])
    return trajectory


def test_same_seed_and_events_give_the_same_run_for_one_or_two_workers(pool_name: str) -> None:
    one, two = run_with_events(1, pool_name + "1"), run_with_events(2, pool_name + "2")
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)


def expected_delayed_run(actions: np.ndarray, delay: int, length: int) -> list[dict]:
    """What one CountingEnv returns, step by step, under SAME_STEP autoreset with ActionDelay(delay),
    a hook that ends episodes after ``length`` steps and RewardScale(2.0): the received action is the
    episode's action of ``delay`` steps ago (its first action until then), and an episode's first
    action is the one of the step after the same-step reset."""
    expected, episode, total = [], [], 0.0
    for action in actions.tolist():
        episode.append(action)
        received = episode[max(0, len(episode) - 1 - delay)]
        total += 2.0 * received
        step = {"reward": 2.0 * received, "observation": [float(len(episode)), float(received)], "done": False}
        if len(episode) == length:
            step.update(done=True, final=step["observation"], observation=[0.0, -1.0], total=total)
            episode, total = [], 0.0
        expected.append(step)
    return expected


def test_hooks_under_same_step_autoreset(pool_name: str) -> None:
    chain = [hooks.ActionDelay(1), helpers.TerminateAfter(3), hooks.RewardScale(2.0), hooks.ObservationNoise(0.0)]
    with shmpool.launch(
        lambda: helpers.CountingEnv(length=100),
        2,
        num_workers=2,
        name=pool_name,
        hooks=chain,
        autoreset_mode=AutoresetMode.SAME_STEP,
        seed=0,
    ) as pool:
        pool.params["observation_noise"][1] = 1.0  # env 0: exact values; env 1: noisy ones
        first, _ = pool.reset()
        assert first[0].tolist() == [0.0, -1.0] and np.all(first[1] != [0.0, -1.0])  # on_reset adds noise
        actions = np.random.default_rng(5).integers(0, 3, (10, 2))
        results = [pool.step(a) for a in actions]
        records = pool.episodes.read()
    for env in range(2):
        expected = expected_delayed_run(actions[:, env], delay=1, length=3)
        for t, ((observations, rewards, terminations, truncations, infos), want) in enumerate(zip(results, expected)):
            where = f"env {env} step {t}"
            assert rewards[env] == want["reward"], where  # the delayed action, scaled
            assert terminations[env] == want["done"] and not truncations[env], where
            if env == 0:
                assert observations[env].tolist() == want["observation"], where
            else:  # noise after steps and on the first observation of a same-step reset
                assert np.all(observations[env] != want["observation"]), where
                assert np.all(np.abs(observations[env] - want["observation"]) < 10), where
            assert bool(infos.get("_final_obs", np.zeros(2, bool))[env]) == want["done"], where
            if want["done"]:
                final = infos["final_obs"][env]
                if env == 0:
                    assert final.tolist() == want["final"], where
                else:  # the final observation is the noisy one the step produced
                    assert np.all(final != want["final"]) and np.all(np.abs(final - want["final"]) < 10), where
                assert infos["_episode"][env] and infos["episode"]["l"][env] == 3, where
                assert infos["episode"]["r"][env] == want["total"], where
        mine = records[records["env_id"] == env]
        assert mine["length"].tolist() == [3, 3, 3] and mine["terminated"].all()
        assert mine["return"].tolist() == [step["total"] for step in expected if step["done"]]
