"""The operators' console of ``vmr-host serve --console``: a web page, the REST API
``/api/v1`` (with an OpenAPI document and a Server-Sent Events stream) and ``/metrics`` in the
Prometheus text format, on a listener of its own that guests never reach (docs/console.md).

General layout::

    app      routes, the listener; auth: the token rule; openapi: the routes described
    options  its flags (``--console*``)
    live     an Experiment watcher: folds, counts and streams each stored report
    views    the REST answers from the live experiment; events: a ``<vm>.jsonl`` paged
    stream   the Server-Sent Events stream; metrics: ``/metrics``
    static/  the page (its timeline drawn by the report's own script)

Host-only: the frozen agent never imports it (aiohttp and prometheus-client stay out of it).

May import: ``host.report``, ``host.serve``, ``host.model``, ``host.logs``, ``core``.
"""
