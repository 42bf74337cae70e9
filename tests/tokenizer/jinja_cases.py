#!/usr/bin/env python3
"""One-line templates exercising every filter, test, operator, method and printing rule the
interpreter supports, with contexts holding Python-only values (floats, big ints). Written
as JSON lines {"template", "context"} for py_reference.py and kvroute-template-compare.
Usage: jinja_cases.py > cases.jsonl"""
import json

CTX = ('{"s": "Hello wORLD  ", "u": "a\\u00f1\\ud83d\\ude00b", "n": 7, "m": -7, "f": 2.5, "z": 0.0, "big": 18446744073709551616,'
       ' "huge": 123456789012345678901234567890, "inf": 1e400, "l": [3, 1, 2], "w": ["b", "A", "c", "a"], "e": [],'
       ' "d": {"b": 1, "a": 2, "10": 3, "2": 4}, "users": [{"name": "x", "age": 30, "tags": ["p"]}, {"name": "Y", "age": 20},'
       ' {"name": "z", "age": 30, "on": true}], "t": true, "no": null, "schema": {"type": "number", "minimum": 0.0,'
       ' "maximum": 1e16, "eps": 1e-05, "neg": -0.0, "two": 2.0, "id": 9007199254740993}, "ws": "\\n\\t x \\u3000\\n"}')

T = r"""
{{ 1 }}|{{ 1.0 }}|{{ 2.5 }}|{{ -0.0 }}|{{ true }}|{{ none }}|{{ undefined_x }}|{{ 1e3 }}|{{ 1_000 }}
{{ [1, 'a', none, true, 1.0, (1,), (1, 2)] }}|{{ {'a': 1, 'b': [2, 'x"y', "it's"]} }}|{{ (1, 2) }}
{{ big }}|{{ huge }}|{{ inf }}|{{ -inf }}|{{ schema }}|{{ f }}|{{ z }}
{{ schema | tojson }}|{{ schema | tojson(indent=2) }}|{{ d | tojson(sort_keys=true) }}|{{ u | tojson }}|{{ u | tojson(ensure_ascii=true) }}
{{ big | tojson }}|{{ inf | tojson }}|{{ [1.5, 1e16, 1e-05, 0.1, 1e22, 123456789.125] | tojson }}|{{ d | tojson(separators=(',', ':')) }}|{{ users | tojson(indent='\t') }}
{{ 'x' | tojson(indent=0) }}|{{ {'a': [1, {}], 'b': []} | tojson(indent=1) }}|{{ none | tojson }}|{{ (1, 2) | tojson }}
{{ 1/2 }}|{{ 4/2 }}|{{ 7//2 }}|{{ -7//2 }}|{{ 7 % 3 }}|{{ -7 % 3 }}|{{ 7 % -3 }}|{{ 2**10 }}|{{ 2**-1 }}|{{ 2**3**2 }}|{{ -2**2 }}
{{ 7.5 // 2 }}|{{ -7.5 % 2 }}|{{ 1 + 1.0 }}|{{ 3 * 1.5 }}|{{ 10 - 2 - 3 }}|{{ 1 + 2 * 3 - 4 / 2 }}|{{ n + 1 }}|{{ n * n * n * n * n * n * n * n * n * n * n * n * n * n * n * n * n * n * n * n * n * n * n }}
{{ 'ab' * 3 }}|{{ 3 * 'ab' }}|{{ [1] * 3 }}|{{ 'a' ~ 1 ~ 1.0 ~ true ~ none ~ [1] }}|{{ 'a' + 'b' }}|{{ [1] + [2] }}|{{ (1,) + (2,) }}
{{ '%s' % 5 }}|{{ '%d-%s' % (3, 'x') }}|{{ '%5.2f|%-4d|%04d|%x|%r' % (3.14159, 7, 42, 255, 'q') }}|{{ '%(a)s!' % {'a': 1} }}|{{ '%%' % () }}|{{ '%s' % [1] }}|{{ '%.3s' % 'abcdef' }}
{{ 1 < 2 }}|{{ 1 == 1.0 }}|{{ '1' == 1 }}|{{ true == 1 }}|{{ none == undefined_y }}|{{ [1] == [1] }}|{{ (1,) == [1] }}|{{ 'a' < 'b' }}|{{ [1, 2] < [1, 3] }}|{{ 1 < 2 < 3 }}|{{ 3 > 2 > 2 }}
{{ big == 18446744073709551616 }}|{{ 9007199254740993 == 9007199254740992.0 }}|{{ {'a': 1} == {'a': 1.0} }}|{{ inf > big }}
{{ 1 and 'x' }}|{{ 0 or 'y' }}|{{ 'a' if 0 else 'b' }}|{{ 'a' if 1 }}|[{{ 'a' if 0 }}]|{{ -n }}|{{ not 0 }}|{{ not true == false }}|{{ +f }}
{{ 'a' in 'cat' }}|{{ 1.0 in [1, 2] }}|{{ 'k' in {'k': 1} }}|{{ 'q' in nothing }}|{{ 3 not in [1] }}|{{ 'b' in d }}|{{ 1 in d }}
{{ s | trim }}|{{ ws | trim }}|[{{ ws | trim('\n') }}]|{{ s | trim('H ') }}|{{ s | upper }}|{{ s | lower }}|{{ s | title }}|{{ 'hello-wORLD (x' | title }}|{{ s | capitalize }}
{{ s | length }}|{{ u | length }}|{{ l | length }}|{{ d | count }}|{{ undefined_z | length }}|{{ u | reverse }}|{{ l | reverse | list }}|{{ s | wordcount }}
{{ s.strip() }}|[{{ ws.strip('\n') }}]|[{{ ws.lstrip('\n') }}]|[{{ ws.rstrip('\n') }}]|[{{ ws.strip() }}]|[{{ ws.rstrip() }}]|{{ s.split() }}|{{ 'a,b,,c'.split(',') }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}
{{ s.upper() }}|{{ s.lower() }}|{{ s.title() }}|{{ "they're bill's" .title() }}|{{ s.capitalize() }}|{{ s.startswith('He') }}|{{ s.endswith(('x', '  ')) }}|{{ s.replace('l', 'L') }}|{{ s.replace('l', 'L', 1) }}|{{ 'ab'.replace('', '-') }}
{{ s.find('o') }}|{{ u.find('b') }}|{{ s.rfind('o') }}|{{ s.count('l') }}|{{ '-'.join(['a', 'b']) }}|{{ 'a\nb\r\nc'.splitlines() }}|{{ s.center(20) }}|{{ '42'.zfill(5) }}|{{ '-42'.zfill(5) }}|{{ 'x'.ljust(3) }}|{{ 'x'.rjust(3) }}
{{ '12'.isdigit() }}|{{ 'ab'.isalpha() }}|{{ ' '.isspace() }}|{{ 'ab'.islower() }}|{{ 'AB'.isupper() }}|{{ 'pre_x'.removeprefix('pre_') }}|{{ 'x.py'.removesuffix('.py') }}|{{ 'ab'.index('b') }}
{{ u[0] }}|{{ u[-1] }}|{{ u[1:3] }}|{{ u[::-1] }}|{{ l[1:] }}|{{ l[:-1] }}|{{ l[::2] }}|{{ l[5] }}|{{ l[-1] }}|{{ (1, 2, 3)[1:] }}|{{ s[100:] }}|{{ l[10:0:-1] }}
{{ d.a }}|{{ d['b'] }}|{{ d.get('zz', 'def') }}|{{ d.get('a') }}|{{ d.items() | list }}|{{ d.keys() | list }}|{{ d.values() | list }}|{{ d['10'] }}|{{ d.missing }}|{{ users[0].name }}|{{ users.0.name }}
{{ l | sort }}|{{ w | sort }}|{{ w | sort(case_sensitive=true) }}|{{ w | sort(reverse=true) }}|{{ users | sort(attribute='age') | map(attribute='name') | list }}|{{ users | sort(attribute='age,name') | length }}
{{ d | dictsort }}|{{ d | dictsort(by='value', reverse=true) }}|{{ d | items | list }}|{{ w | unique | list }}|{{ w | unique(case_sensitive=true) | list }}|{{ l | min }}|{{ l | max }}|{{ w | max }}|{{ l | sum }}|{{ users | sum(attribute='age') }}
{{ l | first }}|{{ l | last }}|{{ e | first }}|{{ s | first }}|{{ l | join(', ') }}|{{ users | join('/', attribute='name') }}|{{ l | list }}|{{ s | list | length }}|{{ d | list }}
{{ users | map(attribute='name') | join(',') }}|{{ w | map('upper') | list }}|{{ users | map(attribute='on', default=false) | list }}|{{ l | select('odd') | list }}|{{ l | reject('odd') | list }}|{{ l | select | list }}
{{ users | selectattr('on') | list | length }}|{{ users | selectattr('age', 'equalto', 30) | map(attribute='name') | list }}|{{ users | rejectattr('age', '>', 25) | map(attribute='name') | list }}|{{ users | selectattr('tags', 'defined') | list | length }}
{{ '42' | int }}|{{ ' 42 ' | int }}|{{ '4.7' | int }}|{{ 'x' | int }}|{{ 'x' | int(7) }}|{{ 4.7 | int }}|{{ -4.7 | int }}|{{ true | int }}|{{ '1_000' | int }}|{{ big | int }}|{{ '0x1A' | int }}
{{ '4.5' | float }}|{{ 'x' | float }}|{{ 3 | float }}|{{ '1e3' | float }}|{{ 'inf' | float }}|{{ 2.5 | round }}|{{ 3.5 | round }}|{{ 2.675 | round(2) }}|{{ 2.1 | round(0, 'ceil') }}|{{ 2.9 | round(method='floor') }}|{{ 7 | round }}
{{ -3 | abs }}|{{ -2.5 | abs }}|{{ x | default('dflt') }}|{{ '' | default('dflt') }}|{{ '' | default('dflt', true) }}|{{ none | d('n') }}|{{ s | string }}|{{ 1.0 | string }}|{{ l | string }}|{{ none | string }}
{{ 'a\nb\n\nc' | indent }}|{{ 'a\nb' | indent(2, true) }}|{{ 'a\n\nb' | indent(2, blank=true) }}|{{ 'a\nb' | indent('> ') }}|{{ 'x' | center(7) }}|{{ '<a href="x">' | e }}|{{ '<b>' | escape }}|{{ 'x' | safe }}
{{ 'abcdefghij' * 30 | truncate(20) }}|{{ 'hello world foo bar baz qux' | truncate(15) }}|{{ 'hello world foo bar baz qux' | truncate(15, true) }}|{{ 'hello world foo' | truncate(14, false, '..', 0) }}
{{ '%s-%s' | format(1, 2) }}|{{ '%(a)s' | format(a='k') }}|{{ users[0] | attr('name') }}|{{ 'x' | attr('upper') is callable }}|{{ 'hello wORLD' | title }}|{{ 'ǆemal' | title }}|{{ 'straße' | upper }}
{{ 1 is odd }}|{{ 2 is even }}|{{ 9 is divisibleby 3 }}|{{ 9 is divisibleby(4) }}|{{ x is defined }}|{{ x is undefined }}|{{ none is none }}|{{ 1 is number }}|{{ true is number }}|{{ 1.0 is integer }}|{{ 1 is integer }}|{{ 1.0 is float }}
{{ 'a' is string }}|{{ d is mapping }}|{{ l is iterable }}|{{ 'a' is iterable }}|{{ 1 is iterable }}|{{ l is sequence }}|{{ d is sequence }}|{{ true is boolean }}|{{ true is true }}|{{ false is false }}|{{ 0 is false }}|{{ range is callable }}
{{ 'abc' is lower }}|{{ 'ABC' is upper }}|{{ 'aB' is lower }}|{{ 3 is eq 3 }}|{{ 3 is ne 3 }}|{{ 3 is lt 4 }}|{{ 3 is le 3 }}|{{ 3 is gt 2 }}|{{ 3 is ge 4 }}|{{ 2 is in [1, 2] }}|{{ 'x' is in 'xyz' }}|{{ none is sameas none }}|{{ 'upper' is filter }}|{{ 'odd' is test }}|{{ 3 is not odd }}|{{ 1 is == 1 }}
{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('a', 'b') }};{% endfor %}
{% for x in l if x > 1 %}{{ x }}{{ loop.length }}{% else %}none{% endfor %}|{% for x in e %}{{ x }}{% else %}empty{% endfor %}|{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}|{% for k in d %}{{ k }}{% endfor %}|{% for c in 'ab😀' %}{{ c }}.{% endfor %}
{% for x in l %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}|{% for x in [1, 2] %}{% for y in [1, 2] %}{% if y == 2 %}{% break %}{% endif %}{{ x }}{{ y }}{% endfor %}{% endfor %}
{% set a = 1 %}{% for x in l %}{% set a = x %}{% endfor %}{{ a }}|{% set ns = namespace(v=0) %}{% for x in l %}{% set ns.v = ns.v + x %}{% endfor %}{{ ns.v }}|{% set p, q = 1, 2 %}{{ p }}{{ q }}|{% set blk %}in{{ 1 }}{% endset %}{{ blk }}|{% set t2 = 1, 2 %}{{ t2 }}
{% macro m(a, b=2) %}{{ a }}-{{ b }}-{{ varargs }}-{{ kwargs }}{% endmacro %}{{ m(1) }}|{{ m(1, 3, 4) }}|{{ m(1, c=5) }}|{% macro r(k) %}{% if k > 0 %}{{ k }}{{ r(k - 1) }}{% endif %}{% endmacro %}{{ r(3) }}
{% filter upper %}abc{{ 1 }}{% endfilter %}|{% set up | upper %}xy{% endset %}{{ up }}|{{ range(3) | list }}|{{ range(1, 10, 3) | list }}|{{ dict(a=1, b=2) }}|{{ namespace(a=1).a }}|{% raw %}{{ raw }}{% endraw %}
{{ raise_exception('boom') }}
{{ 'a' + 1 }}
{{ undefined_q + 1 }}
{{ undefined_q.attr }}
{{ l.append(4) }}
{{ d.pop('a') }}
{{ 1 / 0 }}
{{ 'a' < 1 }}
{{ range(200000) | length }}
{% for x in 5 %}{% endfor %}
{{ {'a': 1} + {} }}
{{ none | tojson(indent=2) }}{{ undefined_q | tojson }}
  {% if true %}
  yes
  {% endif %}
  done
a  {%- if true -%}  b  {%- endif -%}  c
{# comment #}
d {#- c -#} e
{% for i in [1,2,3] %}
  {{ i }}
{% endfor %}
x {{- ' y ' -}} z
    {{ 'expr' }}
    {# c #}
    x
line1\r\n  {% if true %}\r\n  x\r\n  {% endif %}\r\nend
{% generation %}gen {{ 1 }}{% endgeneration %} tail
  {%+ if true %}keep{% endif %}  {% if true +%}
kept newline{% endif %}
{{ "esc\t\\ \x41\u00e9\u2603 'q' \"dq\" \q \101" }}|{{ 'con' 'cat' }}|{{ '\ud83c\udf89' }}
{{ strftime_now('%Y') | length }}|{{ messages | length }}
{{ '}}' }}|{{ "{%" }}|{ {{ 1 }} }|{{ {'a': {'b': 1}} }}|{{ [{'x': [1]}] }}|{{ 'a' ~ 2 * 3 }}|{{ 2 * 3 ~ 'a' }}|{{ 1 + 2 ~ 3 }}
{{ 'a' ~ 1 + 2 }}
{{ not 1 == 2 }}|{{ not (1 == 2) }}|{{ -1 | abs }}|{{ - 1 ** 2 }}|{{ (1, 2) | length }}|{{ 'abc'[1] }}|{{ 'abc'.upper()[0] }}|{{ l | sort | first }}|{{ users | map(attribute='name') | map('upper') | join }}
{{ 1 if t else 2 if no else 3 }}|{{ (1 if no else 2) + 1 }}|{{ t and no }}|{{ no or 0 or '' }}|[{{ no or 0 or '' }}]|{{ n > 5 and n < 10 }}|{{ n is odd and n is not even }}|{{ not n is odd }}
{{ d | dictsort(true) }}|{{ d | dictsort(false, 'value') }}|{{ l | join }}|{{ l | join(d='-') }}|{{ users | map(attribute='age') | unique | list }}|{{ users | map(attribute='tags.0', default='none') | list }}|{{ [[1, 2], [3]] | map('length') | list }}|{{ [1, 2] | map('string') | join('+') }}
{{ w | sort(attribute=none) }}|{{ [3, 1.5, 2] | sort }}|{{ ['b', 'a'] | sort(true) }}|{{ [0, 1, '', 'x', none] | select | list }}|{{ [1, 2, 3, 4] | select('divisibleby', 2) | list }}|{{ [1, 2, 3] | reject('in', [2]) | list }}|{{ [1, 2, 3] | select('>', 1) | list }}
{{ n ~ '' }}|{{ f ~ '' }}|{{ 1e100 }}|{{ 1.0e-10 }}|{{ 0.1 + 0.2 }}|{{ 1/3 }}|{{ 2**0.5 }}|{{ 10 ** 20 }}|{{ 3.0 * 2 }}|{{ 7 / 7 }}|{{ -0.0 | abs }}|{{ 1e16 | int }}|{{ 1e300 * 1e10 }}
{{ 1.5 | string }}|{{ 100000000000000000.0 }}|{{ 1234567890123456.0 }}|{{ 12345678901234567.0 }}|{{ 0.0001 }}|{{ 0.00001 }}|{{ 123e-20 }}|{{ -1.5e-7 }}|{{ [1e16, 1e15] | tojson }}|{{ 5e-324 }}
{{ s[0:5].lower() ~ '|' ~ s[-3:] }}|{{ u | list }}|{{ u | tojson(ensure_ascii=false) }}|{{ '\u2028\x00\x7f\x85é' | tojson }}|{{ '\u2028\x00\x7f\x85é' | tojson(ensure_ascii=true) }}|{{ ['\x85', '\u2028', "'", '"', "\\"] }}
{{ 'x' | tojson(indent=2, separators=(', ', ' = ')) }}|{{ d | tojson(indent=2, separators=(',', ': ')) }}|{{ [1, [2, []], {}] | tojson(indent=-1) }}|{{ {'b': 1, 'a': {'d': 1, 'c': 2}} | tojson(sort_keys=true, indent=1) }}
{% set x = [1, 2] %}{% set y = x + [3] %}{{ x }}{{ y }}|{% set dd = {'k': 'v'} %}{{ dd.k }}{{ dd['k'] }}{{ dd.get('k') }}|{% for a, b in [(1, 2), (3, 4)] %}{{ a + b }}{% endfor %}|{% for a, (b, c) in [(1, (2, 3))] %}{{ a }}{{ b }}{{ c }}{% endfor %}
{% for m in users %}{{ loop.index }}:{{ m.name }}{{ ',' if not loop.last }}{% endfor %}|{% for x in l %}{{ loop.previtem is defined }}{% endfor %}|{% for i in range(3) %}{% for j in range(2) %}{{ loop.index }}{% endfor %}{{ loop.index }};{% endfor %}
{% if n is defined and n > 3 %}big{% elif n > 1 %}mid{% else %}small{% endif %}|{% if no %}x{% elif '' %}y{% else %}z{% endif %}|{% if l %}{% if l | length > 2 %}long{% endif %}{% endif %}
{% macro tool(t) -%}<{{ t.name }}>{{ caller is defined }}{%- endmacro %}{{ tool(users[0]) }}|{% macro two(a, b) %}{{ a }}{{ b }}{% endmacro %}{{ two(b=1, a=2) }}|{% macro k() %}{{ kwargs.x }}{% endmacro %}{{ k(x=5) }}
{%- set ns = namespace(found=false, items=[]) -%}{%- for x in l -%}{%- if x > 1 -%}{%- set ns.found = true -%}{%- endif -%}{%- endfor -%}{{ ns.found }}|{{ namespace(a=1, b=[2]) }}
{{ "a\tb" | indent(2) }}|{{ "\n x" | indent(first=true) }}|{{ "x\r\ny" | indent(1) }}|{{ 'a\u2028b' | indent(1) }}|{{ ''.join(['a', 'b']) }}|{{ 'x'.join('abc') }}
{{ 'Hello'.startswith(('a', 'H')) }}|{{ 'a b  c'.split(' ') }}|{{ '  a b  '.split() }}|{{ '  a b  c '.split(none, 1) }}|{{ 'a b c'.rsplit(none, 1) }}|{{ 'a\u3000b'.split() }}|{{ 'abc'.split('b', -1) }}|{{ ''.split(',') }}|{{ ''.split() }}
{{ 'ǅ'.lower() }}|{{ 'ǅ'.upper() }}|{{ 'ǆa'.capitalize() }}|{{ 'ÉCOLE école'.title() }}|{{ 'Σ'.lower() }}|{{ 'ﬁ'.upper() }}|{{ 'İ'.lower() | length }}|{{ 'ß'.title() }}|{{ 'ﬃx' | upper }}
{{ '%-5s|' % 'ab' }}|{{ '%5s|' % 'ab' }}|{{ '%+d %+d' % (5, -5) }}|{{ '%e' % 12345.678 }}|{{ '%g' % 0.0001 }}|{{ '%G' % 1e20 }}|{{ '%o' % 8 }}|{{ '%#x' % 255 }}|{{ '%c' % 65 }}|{{ '%s %s' % ('a', none) }}|{{ '%d' % 3.9 }}|{{ '%s' % (1, 2) }}
{{ '%d' % 'x' }}
{{ '%s %s' % 'x' }}
{{ '%s' % () }}
{{ x.y }}
{{ none.x }}
{{ 1 is divisibleby 0 }}
{{ [1] | first | first }}
{{ l | batch(2) | list }}
{% for x in l %}{{ x }}{% endfor %}{% break %}
{% set l.x = 1 %}
{{ range(10, 0, -3) | list }}|{{ range(0) | list }}|{{ range(-3) | list }}|{{ range(5)[1:3] | list }}|{{ range(2, 5) | sum }}|{{ [] | sum }}|{{ [1.5, 2] | sum }}|{{ [[1], [2]] | sum(start=[]) }}
{{ users | selectattr('age', 'ge', 30) | map(attribute='name') | join(', ') }}|{{ users | rejectattr('on') | map(attribute='name') | list }}|{{ users | selectattr('name', 'in', ['x', 'z']) | list | length }}|{{ users | map(attribute='missing') | list }}
{{ d.items() }}
{{ d.keys() }}
{{ users[0].keys() | list }}|{{ 'name' in users[0] }}|{{ users[0]['tags'] | first }}|{{ users[1].tags is undefined }}|{{ users[1].tags | default([]) | length }}|{{ users[-1].on }}|{{ users[5] is undefined }}
{{ schema.minimum }}|{{ schema.maximum }}|{{ schema.eps }}|{{ schema.neg }}|{{ schema.two }}|{{ schema.id }}|{{ schema.id + 0 }}|{{ schema.two * 2 }}|{{ schema.maximum | int }}|{{ schema.id | string }}|{{ schema.eps | round(7) }}
{{ -big }}|{{ big | abs }}|{{ big > 1 }}|{{ big == big }}|{{ big | string | length }}|{{ [big] | tojson }}|{{ huge }}|{{ big is integer }}|{{ big is number }}
{% for x in [1,2] %}{% if loop.first %}{% set y = 5 %}{% endif %}[{{ y }}]{% endfor %}|{% set y = 1 %}{% for x in [1,2] %}{% if loop.first %}{% set y = 5 %}{% endif %}[{{ y }}]{% endfor %}{{ y }}
{% macro m() %}{{ g }}{% endmacro %}{% set g = 3 %}{{ m() }}|{% for x in [1] %}{% macro m2() %}{{ x }}{% endmacro %}{{ m2() }}{% endfor %}|{% set x = 7 %}{% macro m3() %}{{ x }}{% endmacro %}{% for x in [1] %}{{ m3() }}{% endfor %}|{% macro outer(a) %}{% macro inner() %}{{ a }}{% endmacro %}{{ inner() }}{% endmacro %}{{ outer(4) }}
{{ inf }}|{{ inf > 1 }}|{{ -inf | tojson }}|{{ inf | int }}
{{ inf - inf }}|{{ (inf - inf) | tojson }}|{{ (inf - inf) == (inf - inf) }}
"""


def main():
    for line in T.strip("\n").split("\n"):
        tpl = line.replace("\\r\\n", "\r\n") if line.startswith("line1") else line
        print(json.dumps({"template": tpl, "context": CTX}))
    # multi-line whitespace-control templates, as whole templates
    print(json.dumps({"template": "  {% if true %}\n  yes\n  {% endif %}\n  done\n", "context": "{}"}))
    print(json.dumps({"template": "{% for m in ms %}\n  {%- if m %}\n    {{ m }}\n  {%- endif %}\n{% endfor %}\n\n", "context": '{"ms": [1, 0, 2]}'}))
    print(json.dumps({"template": "{# c #}\n{% set x = 1 %}\n\n  {{ x }}\n{%- raw -%}\n  raw {{ }}\n{%- endraw %}\nafter\n", "context": "{}"}))


if __name__ == "__main__":
    main()
