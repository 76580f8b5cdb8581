"""What the API and the workers share: job records in Redis, image stores, and the names of the queues.

Words, each with one meaning: a *job record* (`job_record.JobRecord`) is a job's Redis hash; an
*upload* is a client's input image (`upload_store`, for `POST /v1/uploads` and inline data URIs),
never an output; an *image store* (`image_store`: S3 or a local folder) holds the images jobs make;
`queue_names` names Celery's tasks and queues, and `fair_share` holds the order in which a queue's
jobs are taken.
"""
