"""PPO on a shmpool pool while the envs change: CartPole-v1 with a curriculum that lengthens the pole,
or a MuJoCo robot with per-episode domain randomization, in one file.

The algorithm is CleanRL's ``ppo.py`` (Huang et al., "The 37 Implementation Details of PPO", 2022):
GAE, clipped policy and value losses, advantage normalization, annealed learning rate. The envs run
in a shmpool pool instead of a gymnasium vector env, and a ``shmpool.curricula.Threshold``
curriculum reads the pool's finished episodes after every rollout: each time the mean return of the
last ``--window`` episodes reaches ``--target``, it writes a pole ``--length-step`` longer into
``pool.params["length"]`` (every env uses it from its next episode), up to ``--max-length``.

With a MuJoCo id (``--env HalfCheetah-v5``) the policy is a Gaussian (CleanRL's
``ppo_continuous_action.py``, without its observation and reward normalization wrappers), and every
episode draws the torso mass x U(0.8, 1.2) and the floor friction x U(0.5, 1.5)
(``shmpool.mujoco.scale_randomization``); ``--engine mujoco`` steps them on MuJoCo's batch stepper.

It prints a row of returns every ``--print-every`` iterations and the curriculum's changes as they
happen, and saves a plot of the returns and the changed parameter to ``--plot``.

    pip install -e ".[examples]"
    python scripts/ppo.py             # 200,000 env steps: 15 to 40 s on 2 cores
    python scripts/ppo.py --quick     # a few seconds, for CI
    python scripts/ppo.py --async     # rollouts with send/recv: the policy runs on one half of the
                                      # envs while the workers step the other half
    python scripts/ppo.py --env HalfCheetah-v5 --engine mujoco --num-envs 16 --total-timesteps 500000
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any

import _settings
import numpy as np

import shmpool
from shmpool.curricula import Threshold

try:
    import torch
    from torch import nn
    from torch.distributions import Categorical, Normal
except ImportError as exc:
    raise SystemExit(f'ppo.py trains with torch: pip install -e ".[examples]" ({exc})') from exc


@dataclass
class Settings:
    """What PPO runs."""

    env: str = "CartPole-v1"
    """CartPole-v1 (with the pole-length curriculum) or a MuJoCo robot (with domain randomization)."""
    engine: str = "python"
    """how the pool steps the envs: python, numba (CartPole) or mujoco (MuJoCo robots)."""
    num_envs: int = 8
    """envs in the pool."""
    num_workers: int | None = None
    """worker processes (default: the engine's fastest placement for this machine)."""
    total_timesteps: int = 200_000
    """env steps to train for."""
    num_steps: int = 128
    """steps per env per rollout."""
    learning_rate: float = 2.5e-4
    """Adam's learning rate (annealed linearly to 0 when --anneal-lr)."""
    anneal_lr: bool = True
    """anneal the learning rate."""
    gamma: float = 0.99
    """discount factor."""
    gae_lambda: float = 0.95
    """lambda of generalized advantage estimation."""
    num_minibatches: int = 4
    """minibatches per epoch."""
    update_epochs: int = 4
    """epochs over each rollout."""
    clip_coef: float = 0.2
    """clipping coefficient of the policy (and value) loss."""
    ent_coef: float = 0.01
    """weight of the entropy bonus."""
    vf_coef: float = 0.5
    """weight of the value loss."""
    max_grad_norm: float = 0.5
    """gradient norm clip."""
    target: float = 200.0
    """mean return of the last --window episodes that lengthens the pole."""
    window: int = 20
    """episodes averaged by the curriculum."""
    length_step: float = 0.25
    """how much longer the pole gets each time (gymnasium's `length` is half the pole, nominal 0.5)."""
    max_length: float = 2.0
    """the longest pole the curriculum goes to."""
    print_every: int = 20
    """iterations between rows of the table."""
    seed: int = 1
    """seed of the pool and of torch."""
    torch_threads: int = 1
    """torch threads (the workers need the other cores)."""
    plot: str = "ppo.png"
    """where to save the PNG plot ('' for none)."""
    async_: bool = False
    """collect rollouts with the async API (batch_size = num_envs / 2, send/recv) instead of step."""
    quick: bool = False
    """a short run for CI: 8,192 env steps, 64 steps per rollout, a target of 30."""


def parse_settings(argv: list[str] | None = None) -> Settings:
    """Reads Settings from the command line; --quick overrides the sizes (not the options given)."""
    given = _settings.parse_given(Settings, argv, description=__doc__)
    settings = Settings(**given)
    if settings.quick:
        quick = {"total_timesteps": 8 * 64 * 16, "num_steps": 64, "target": 30.0, "window": 10, "print_every": 2}
        for name, value in quick.items():
            if name not in given:
                setattr(settings, name, value)
    return settings


def layer(linear: nn.Linear, std: float = np.sqrt(2), bias: float = 0.0) -> nn.Linear:
    """Orthogonal weights and constant biases, as CleanRL initializes them."""
    nn.init.orthogonal_(linear.weight, std)
    nn.init.constant_(linear.bias, bias)
    return linear


class Agent(nn.Module):
    """Separate actor and critic MLPs (64-64, tanh) over a vector observation; the actor gives the
    logits of a discrete action, or the mean of a Gaussian over a continuous one (with a learned,
    state-independent log standard deviation)."""

    def __init__(self, observation_size: int, num_actions: int, continuous: bool = False) -> None:
        super().__init__()
        self.continuous = continuous
        self.log_std = nn.Parameter(torch.zeros(num_actions)) if continuous else None
        self.critic = nn.Sequential(
            layer(nn.Linear(observation_size, 64)),
            nn.Tanh(),
            layer(nn.Linear(64, 64)),
            nn.Tanh(),
            layer(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer(nn.Linear(observation_size, 64)),
            nn.Tanh(),
            layer(nn.Linear(64, 64)),
            nn.Tanh(),
            layer(nn.Linear(64, num_actions), std=0.01),  # near-uniform first policy
        )

    def value(self, observations: torch.Tensor) -> torch.Tensor:
        """V(s), shape (batch,)."""
        return self.critic(observations).squeeze(-1)

    def act(
        self, observations: torch.Tensor, actions: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Samples actions (or scores the given ones): actions, log-probabilities, entropies, values."""
        if self.log_std is not None:
            mean = self.actor(observations)
            gaussian = Normal(mean, self.log_std.expand_as(mean).exp())
            if actions is None:
                actions = gaussian.sample()
            return actions, gaussian.log_prob(actions).sum(-1), gaussian.entropy().sum(-1), self.value(observations)
        distribution = Categorical(logits=self.actor(observations))
        if actions is None:
            actions = distribution.sample()
        return actions, distribution.log_prob(actions), distribution.entropy(), self.value(observations)


class Rollout:
    """Fills the rollout buffers (step x env) from a pool: with ``step``, or with ``send``/``recv``."""

    def __init__(self, observations, actions, log_probs, rewards, dones, values, gamma: float, bounds=None) -> None:  # noqa: ANN001
        self.observations, self.actions, self.log_probs = observations, actions, log_probs
        self.rewards, self.dones, self.values, self.gamma = rewards, dones, values, gamma
        self.bounds = bounds  # a continuous action space's (low, high): actions sent are clipped to them

    def _record(self, agent: Agent, step: Any, env_ids: Any, observations: torch.Tensor, done: torch.Tensor) -> Any:
        """Stores the observations and picks the actions of envs ``env_ids`` at their step ``step``."""
        if not isinstance(env_ids, slice):
            env_ids = torch.as_tensor(env_ids, dtype=torch.long)
        self.observations[step, env_ids], self.dones[step, env_ids] = observations, done
        with torch.no_grad():
            action, log_prob, _, value = agent.act(observations)
        self.actions[step, env_ids] = action.to(self.actions.dtype)
        self.log_probs[step, env_ids], self.values[step, env_ids] = log_prob, value
        if self.bounds is not None:
            return np.clip(action.numpy(), *self.bounds).astype(np.float32)
        return action.numpy()

    def _reward(self, agent: Agent, reward: np.ndarray, terminations: np.ndarray, truncations: np.ndarray, infos):  # noqa: ANN001
        """The rewards, with a time-limit cut bootstrapped from the cut episode's last observation."""
        cut = truncations & ~terminations
        if cut.any():
            final = torch.as_tensor(np.stack(infos["final_obs"][cut]), dtype=torch.float32)
            with torch.no_grad():
                reward[cut] += self.gamma * agent.value(final).numpy()
        return torch.as_tensor(reward, dtype=torch.float32)

    def collect(self, pool: Any, agent: Agent, next_observations: torch.Tensor, next_dones: torch.Tensor):  # noqa: ANN201
        """A rollout of synchronous steps; returns the observations and dones it ends on."""
        every = slice(None)
        for step in range(len(self.rewards)):
            action = self._record(agent, step, every, next_observations, next_dones)
            next_np, reward, terminations, truncations, infos = pool.step(action)
            self.rewards[step] = self._reward(agent, reward, terminations, truncations, infos)
            next_observations = torch.as_tensor(next_np, dtype=torch.float32)
            next_dones = torch.as_tensor(terminations | truncations, dtype=torch.float32)
        return next_observations, next_dones

    def collect_async(self, pool: Any, agent: Agent, carry: list[tuple[Any, Any, Any]]) -> tuple[Any, Any]:
        """A rollout with send/recv (EnvPool's way): the policy acts on one batch while the workers
        step the other, and each env advances through its own steps as its batch comes back. A batch
        whose envs have all their steps waits, unsent, in ``carry``: its observations start the next
        rollout. Returns the observations and dones the envs end on."""
        num_steps, num_envs = self.rewards.shape
        taken = np.zeros(num_envs, dtype=np.int64)  # steps recorded per env in this rollout
        next_observations, next_dones = torch.zeros(self.observations.shape[1:]), torch.zeros(num_envs)
        pending, held = list(carry), 0
        carry.clear()
        while held < num_envs:
            if pending:  # envs whose last rollout ended with their observation in hand
                env_ids, observations, done = pending.pop()
            else:
                next_np, reward, terminations, truncations, infos = pool.recv()
                env_ids = infos["env_id"]
                observations = torch.as_tensor(next_np, dtype=torch.float32)
                done = torch.as_tensor(terminations | truncations, dtype=torch.float32)
                step = taken[env_ids[0]]  # a batch's envs always move together
                if step > 0:  # the reward of the action taken at their previous step (none after async_reset)
                    rewards = self._reward(agent, reward, terminations, truncations, infos)
                    self.rewards[step - 1, torch.as_tensor(env_ids, dtype=torch.long)] = rewards
                if step == num_steps:
                    rows = torch.as_tensor(env_ids, dtype=torch.long)
                    next_observations[rows], next_dones[rows] = observations, done
                    carry.append((env_ids, observations, done))
                    held += len(env_ids)
                    continue
            pool.send(self._record(agent, taken[env_ids[0]], env_ids, observations, done), env_ids)
            taken[env_ids] += 1
        return next_observations, next_dones


def update(
    agent: Agent,
    optimizer: torch.optim.Optimizer,
    rollout: Rollout,
    next_observations: Any,
    next_dones: Any,
    settings: Settings,
) -> None:
    """PPO's update from a full rollout: generalized advantage estimation, then ``update_epochs``
    epochs of clipped policy and value losses over shuffled minibatches."""
    rewards, dones, values = rollout.rewards, rollout.dones, rollout.values
    num_steps, num_envs = rewards.shape
    with torch.no_grad():  # generalized advantage estimation, backwards over the rollout
        next_value = agent.value(next_observations)
        advantages = torch.zeros_like(rewards)
        running = torch.zeros(num_envs)
        for t in reversed(range(num_steps)):
            # dones[t + 1] (next_dones at the end) marks observation t + 1 as a new episode's first.
            following_done, following_value = (
                (next_dones, next_value) if t == num_steps - 1 else (dones[t + 1], values[t + 1])
            )
            delta = rewards[t] + settings.gamma * following_value * (1.0 - following_done) - values[t]
            running = delta + settings.gamma * settings.gae_lambda * (1.0 - following_done) * running
            advantages[t] = running
        returns = advantages + values

    continuous = agent.continuous
    batch = {
        "observations": rollout.observations.flatten(0, 1),
        "actions": rollout.actions.flatten(0, 1) if continuous else rollout.actions.flatten(0, 1).long(),
        "log_probs": rollout.log_probs.reshape(-1),
        "advantages": advantages.reshape(-1),
        "returns": returns.reshape(-1),
        "values": values.reshape(-1),
    }
    batch_size = num_steps * num_envs
    for _ in range(settings.update_epochs):
        for indices in torch.randperm(batch_size).split(batch_size // settings.num_minibatches):
            _, new_log_prob, entropy, new_value = agent.act(batch["observations"][indices], batch["actions"][indices])
            ratio = (new_log_prob - batch["log_probs"][indices]).exp()
            advantage = batch["advantages"][indices]
            advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
            clipped_ratio = ratio.clamp(1 - settings.clip_coef, 1 + settings.clip_coef)
            policy_loss = torch.max(-advantage * ratio, -advantage * clipped_ratio).mean()
            old_value, target = batch["values"][indices], batch["returns"][indices]
            clipped_value = old_value + (new_value - old_value).clamp(-settings.clip_coef, settings.clip_coef)
            value_loss = 0.5 * torch.max((new_value - target) ** 2, (clipped_value - target) ** 2).mean()
            loss = policy_loss - settings.ent_coef * entropy.mean() + settings.vf_coef * value_loss
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), settings.max_grad_norm)
            optimizer.step()


class PpoIteration:
    """CleanRL's PPO on one vector env (the agent, rollout and update above; a Gaussian policy
    for Box actions, as CleanRL's ppo_continuous_action.py; same-step autoreset, as CleanRL's layout
    assumes): each call runs one iteration, a rollout then an update, and returns the env steps it
    took and the seconds spent in ``step``."""

    def __init__(self, envs: Any, settings: Settings | None = None) -> None:
        self.envs = envs
        self.settings = settings or Settings(num_envs=envs.num_envs)
        self.num_envs, observation_shape = envs.num_envs, envs.single_observation_space.shape
        space = envs.single_action_space
        continuous = not hasattr(space, "n")  # a Box: the Gaussian policy, clipped to the bounds
        self.agent = Agent(observation_shape[0], space.shape[0] if continuous else int(space.n), continuous)
        self.optimizer = torch.optim.Adam(self.agent.parameters(), lr=self.settings.learning_rate, eps=1e-5)
        shape = (self.settings.num_steps, self.num_envs)
        zeros = torch.zeros
        self.rollout = Rollout(
            zeros(shape + observation_shape),
            zeros(shape + space.shape),
            *(zeros(shape) for _ in range(4)),
            self.settings.gamma,
            (space.low, space.high) if continuous else None,
        )
        self.stepping = 0.0
        self.next_observations = torch.as_tensor(envs.reset(seed=self.settings.seed)[0], dtype=torch.float32)
        self.next_dones = zeros(self.num_envs)

    def step(self, actions: Any) -> Any:
        """The env's step, timed."""
        start = time.perf_counter()
        try:
            return self.envs.step(actions)
        finally:
            self.stepping += time.perf_counter() - start

    def __call__(self) -> tuple[int, float]:
        self.stepping = 0.0
        self.next_observations, self.next_dones = self.rollout.collect(
            self, self.agent, self.next_observations, self.next_dones
        )
        update(self.agent, self.optimizer, self.rollout, self.next_observations, self.next_dones, self.settings)
        return self.settings.num_steps * self.num_envs, self.stepping


def save_plot(path: str, episodes: np.ndarray, num_envs: int, env_id: str, param: str) -> str:
    """Plots each episode's return and parameter ``param`` against env steps; returns what happened."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return 'matplotlib is not installed (pip install -e ".[examples]"): no plot'
    episodes = episodes[np.argsort(episodes["step"], kind="stable")]  # workers' rings interleave in time
    steps = episodes["step"] * num_envs
    returns = episodes["return"]
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    top.scatter(steps, returns, s=3, alpha=0.3, label="episode")
    if len(returns) >= 1:
        width = max(1, len(returns) // 50)
        smooth = np.convolve(returns, np.ones(width) / width, mode="valid")
        top.plot(steps[width - 1 :], smooth, color="C1", label=f"mean of {width}")
    top.set_ylabel("return")
    top.legend(loc="upper left")
    if param == "length":
        bottom.plot(steps, episodes["params"][param], drawstyle="steps-post")
        bottom.set_ylabel("pole length (half)")
        figure.suptitle(f"PPO on {env_id}, shmpool pool, pole-length curriculum")
    else:
        bottom.scatter(steps, episodes["params"][param], s=3, alpha=0.3)
        bottom.set_ylabel(f"{param} (drawn per episode)")
        figure.suptitle(f"PPO on {env_id}, shmpool pool, domain randomization")
    bottom.set_xlabel("env steps")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    return f"plot saved to {path}"


def main(argv: list[str] | None = None) -> int:
    """Trains, prints the table and saves the plot."""
    settings = parse_settings(argv)
    torch.manual_seed(settings.seed)
    torch.set_num_threads(settings.torch_threads)
    batch_size = settings.num_envs * settings.num_steps
    num_iterations = max(1, settings.total_timesteps // batch_size)
    cartpole = settings.env.startswith("CartPole")
    if cartpole:
        # "reset": a longer pole takes effect at each env's next episode, never halfway through one.
        params = {"length": shmpool.Param(low=0.1, high=settings.max_length, when="reset")}
        curriculum: Threshold | None = Threshold(
            "length", step=settings.length_step, target=settings.target, window=settings.window
        )
        shown_param = "length"
    else:
        from shmpool import mujoco as smj

        smj.log_to_python()
        params, curriculum, shown_param = smj.scale_randomization(), None, "mass_scale"
    worker_init = None if cartpole else smj.log_to_python  # MuJoCo's warnings to logging in the workers too
    episodes: list[np.ndarray] = []
    started = time.perf_counter()
    # SAME_STEP autoreset: the observation after a done step already starts the next episode, as the
    # rollout below assumes (CleanRL's layout); the last one comes in infos["final_obs"].
    with shmpool.launch(
        settings.env,
        settings.num_envs,
        num_workers=settings.num_workers,
        engine=settings.engine,
        worker_init=worker_init,
        params=params,
        seed=settings.seed,
        autoreset_mode="SameStep",
        batch_size=settings.num_envs // 2 if settings.async_ else None,
    ) as pool:
        space = pool.single_action_space
        continuous = not cartpole
        num_actions = space.shape[0] if continuous else int(space.n)
        agent = Agent(pool.single_observation_space.shape[0], num_actions, continuous)
        optimizer = torch.optim.Adam(agent.parameters(), lr=settings.learning_rate, eps=1e-5)
        shape = (settings.num_steps, settings.num_envs)
        observations = torch.zeros(shape + pool.single_observation_space.shape)
        log_probs, rewards, dones, values = (torch.zeros(shape) for _ in range(4))
        actions = torch.zeros(shape + space.shape)
        bounds = (space.low, space.high) if continuous else None
        carry: list[tuple[Any, Any, Any]] = []  # async: batches received, to be sent by the next rollout
        if settings.async_:
            pool.async_reset()
            next_observations = next_dones = torch.zeros(0)  # the async rollout keeps its own
        else:
            next_observations = torch.as_tensor(pool.reset()[0], dtype=torch.float32)
            next_dones = torch.zeros(settings.num_envs)
        print(
            f"pool {pool.name}: {settings.num_envs} {settings.env} envs in {len(pool.config.slots)} slots, "
            f"engine {settings.engine}"
        )
        column = "pole" if cartpole else "mass"  # the pole's half-length, or the mean torso-mass scale drawn
        print(f"{'iteration':>9} {'env steps':>10} {'steps/s':>8} {'episodes':>8} {'mean return':>11} {column:>5}")
        shown = 0  # episodes already in a row of the table
        for iteration in range(1, num_iterations + 1):
            if settings.anneal_lr:
                optimizer.param_groups[0]["lr"] = settings.learning_rate * (1.0 - (iteration - 1.0) / num_iterations)

            rollout = Rollout(observations, actions, log_probs, rewards, dones, values, settings.gamma, bounds)
            if settings.async_:
                next_observations, next_dones = rollout.collect_async(pool, agent, carry)
            else:
                next_observations, next_dones = rollout.collect(pool, agent, next_observations, next_dones)

            update(agent, optimizer, rollout, next_observations, next_dones, settings)

            # The curriculum sees every episode finished so far; each env picks up its change at its next reset.
            records = pool.episodes.read()
            episodes.append(records)
            if (
                curriculum is not None
                and len(records)
                and (curriculum.value is None or curriculum.value < settings.max_length)
            ):
                for line in curriculum.update(records, pool.params):
                    print(f"{'':>9} curriculum: {line}", flush=True)
            if iteration % settings.print_every == 0 or iteration == num_iterations:
                recent = np.concatenate(episodes)[shown:]
                shown += len(recent)
                mean_return = f"{recent['return'].mean():11.1f}" if len(recent) else f"{'-':>11}"
                env_steps = iteration * batch_size
                rate = env_steps / (time.perf_counter() - started)
                length = float(np.mean(pool.applied[shown_param]))
                print(
                    f"{iteration:>9} {env_steps:>10,} {rate:>8,.0f} {len(recent):>8} {mean_return} {length:>5.2f}",
                    flush=True,
                )
        final_length = float(pool.params["length"][0]) if cartpole else float("nan")
    elapsed = time.perf_counter() - started
    everything = np.concatenate(episodes)
    last = everything["return"][-settings.window :]
    print(
        f"\n{num_iterations * batch_size:,} env steps in {elapsed:.1f} s; {len(everything)} episodes; "
        f"mean return of the last {len(last)}: {last.mean() if len(last) else float('nan'):.1f}; "
        + (f"pole length {final_length:g}" if cartpole else "randomized per episode")
    )
    if settings.plot:
        print(save_plot(settings.plot, everything, settings.num_envs, settings.env, shown_param))
    return 0


if __name__ == "__main__":
    sys.exit(main())
