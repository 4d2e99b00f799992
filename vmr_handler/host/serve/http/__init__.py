"""VM-resource files and transfers out over HTTP(S): ``vmr-host serve --http``.

General layout::

    server    ResourceHttp: downloads (``/r/``) and the server
    _uploads  uploads (``/t/``)
    common    what downloads and uploads share
    options   the ``--http*`` flags and the per-VM tokens

May import: ``host.serve.files``, ``host.serve.config``, ``host.logs``, ``core``.
"""
