"""The operators' console of ``vmr-host serve --console`` (issue 14): a web page, the REST API
``/api/v1`` (with an OpenAPI document and a Server-Sent Events stream) and ``/metrics`` in the
Prometheus text format, on a listener of its own that guests never reach (docs/console.md).

Host-only: the frozen agent never imports it (aiohttp and prometheus-client stay out of it).
"""
