-- FOREACH: a JSON array payload becomes one row per element.
return {
    name = "each",
    from = { "batch/#" },
    sample = { topic = "batch/1", payload = "[1, 2]" },
    select = function(msg)
        local rows = {}
        for i, v in ipairs(json.decode(msg.payload)) do
            rows[#rows + 1] = { i = i, v = v, topic = msg.topic }
        end
        return rows
    end,
    to = { store = { table = "items" } },
}
