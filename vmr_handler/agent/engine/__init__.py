"""The engine and its parts: plays a schedule's plan on a clock (SPEC sections 4-5).

General layout::

    engine       Engine and open_engine: the parts put together; RESUMEs, appends, status
    shared       EngineState: what the parts share, by name (schedule, phase, journal, clock,
                 reports, working dirs, data placement, wake and stop)
    config       EngineConfig: how and where the engine works
    status       what it says of itself: first events, how its entries ended
    ports        what it needs from the machine, as protocols (its seams)
    entries      EntryLauncher: prepare, start together, follow to the end
    placement    when an entry's data lands
    stages       negative time: one stage at a time, and reboots; _stageplay: stages in order
    holds        the -inf pauses and breaks; arming: positive time, timers on the clock
    appends      batches appended to the running schedule: checked, numbered, kept
    hostcalls    on_host entries, the agent's part
    _reminders   what it waits for, said now and then

May import: ``agent.state``, ``agent.machine``, ``transports``, ``core``. What it needs from
above (an appended batch's files) it declares in ``ports`` and is handed.
"""
