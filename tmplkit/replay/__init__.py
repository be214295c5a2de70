"""The replay layer: a session's turns replayed on a model through the prefill runner, the
prediction of the turns study beside what the model measured (`replay_session`)."""

from .replaying import (
    REPLAY_SCHEMA_VERSION,
    REPLAYABLE,
    REPLAYED,
    ReplayedRequest,
    SessionReplay,
    memory_of,
    plot_replay,
    replay_png,
    replay_session,
)

__all__ = ["REPLAY_SCHEMA_VERSION", "REPLAYABLE", "REPLAYED", "ReplayedRequest", "SessionReplay", "memory_of", "plot_replay",
           "replay_png", "replay_session"]
