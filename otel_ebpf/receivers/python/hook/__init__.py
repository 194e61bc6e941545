"""Not imported: the folder receivers.python.profile_hook puts first on a traced command's PYTHONPATH, for its
sitecustomize.py (a package only so that the wheel check sees every Python folder as one)."""
