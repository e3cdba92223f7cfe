-- template(text, row): fills "${name}" placeholders from row.
--
--   template("${clientid}/${payload.sensor}", row)
--
-- A placeholder is a path of names (or array indexes) separated by dots, looked up
-- in row one step at a time. Strings and numbers are inserted as they are
-- (tostring), booleans as true/false, tables as JSON; a path that leads nowhere
-- (or to json.null) inserts the empty string. "$${" is a literal "${".
--
-- Loaded into every rule state from lua/, read-only (the rule engine embeds it).

local type, tostring, tonumber = type, tostring, tonumber
local gsub, gmatch = string.gsub, string.gmatch
local encode, null = json.encode, json.null

local function lookup(row, path)
    local v = row
    for part in gmatch(path, "[^%.]+") do
        if type(v) ~= "table" then
            return nil
        end
        local nv = v[part]
        if nv == nil then
            local i = tonumber(part)
            if i then
                nv = v[i]
            end
        end
        v = nv
    end
    return v
end

local function fill(row, path)
    local v = lookup(row, path)
    if v == nil or v == null then
        return ""
    end
    if type(v) == "table" then
        return encode(v)
    end
    return tostring(v)
end

return function(text, row)
    if type(text) ~= "string" then
        error("template: the template must be a string", 2)
    end
    if type(row) ~= "table" then
        error("template: the values must be a table", 2)
    end
    return (gsub(text, "(%$?)%${([^}]*)}", function(escape, path)
        if escape == "$" then
            return "${" .. path .. "}"
        end
        return fill(row, path)
    end))
end
