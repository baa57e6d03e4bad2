-- wrk script for benches/serve-http/run.sh: each wrk thread loads its share
-- of requests.tsv (every Nth line), formats every request once in init(),
-- and sends each exactly once (POST to the URL's path, signature headers
-- included; a server that ignores them, like examples/http_receiver.rs,
-- gets the same bytes). run.sh generates more requests than a run sends;
-- a thread that still runs out stops (run.sh then reports the run invalid).
local threads = {}
local counter = 0

function setup(thread)
  thread:set("index", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

function init(args)
  local file = os.getenv("REQUESTS")
  local total = tonumber(os.getenv("THREADS") or "2")
  requests = {}
  local n = 0
  for line in io.lines(file) do
    if n % total == index then
      local id, ts, sig, body = line:match("^([^\t]*)\t([^\t]*)\t([^\t]*)\t(.*)$")
      requests[#requests + 1] = wrk.format("POST", nil, {
        ["Content-Type"] = "application/json",
        ["webhook-id"] = id,
        ["webhook-timestamp"] = ts,
        ["webhook-signature"] = sig,
      }, body)
    end
    n = n + 1
  end
  next_request = 0
end

function request()
  next_request = next_request + 1
  local r = requests[next_request]
  if r == nil then
    wrk.thread:stop()
    return requests[#requests]
  end
  return r
end

function done(summary, latency, requests)
  local errors = summary.errors
  io.write(string.format("requests %d, non-2xx %d, socket errors %d/%d/%d/%d\n",
    summary.requests, errors.status, errors.connect, errors.read, errors.write, errors.timeout))
end
