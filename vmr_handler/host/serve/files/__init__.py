"""Files in and out of the VMs, confined to their own directories and hashed.

General layout::

    resources      the VM-resource store (``--resources``)
    transfers      files a VM transfers out
    transferpaths  where a transferred file goes
    chunkhash      the sha256 of a file assembled from chunks, kept as it grows

May import: ``host.logs``, ``core``.
"""
