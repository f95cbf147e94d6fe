"""Where files live: the Storage protocol, the local folder, S3 buckets, and a tenant's assets."""
