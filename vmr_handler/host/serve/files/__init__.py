"""Files in and out of the VMs, confined to their own directories and hashed.

General layout::

    resources      the VM-resource store (``--resources``)
    transfers      files a VM transfers out
    transferpaths  where a transferred file goes
    destinations   copies of transferred files to the destination directories schedules name
    chunkhash      the sha256 of a file assembled from chunks, kept as it grows

May import: ``host.logs``, ``core``.
"""
