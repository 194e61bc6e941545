"""Who a process is: process, container, Kubernetes pod and GPU identity read from /proc,
cgroups, the API server and NVML; the host timeline; where the traced libraries are.
"""
