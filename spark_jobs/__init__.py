"""spark_jobs"""

from spark_jobs import zipcache as _zipcache

# In a Spark Python worker, before the first task's function runs: zipcache says why.
if _zipcache.needed():
    _zipcache.install()
