"""Every failed call raises the exception class of its result code, with the
library's message, the C function, and the logger's detail when there is one."""
import pytest

import mstar_kv as mk
from mstar_kv import _ffi


def test_every_result_code_has_its_own_exception_class_under_MskvError():
    classes = mk.ERROR_CLASSES
    assert sorted(classes) == sorted(code for code, _ in _ffi.RESULTS)
    assert len(set(classes.values())) == len(classes)
    for code, cls in classes.items():
        assert issubclass(cls, mk.MskvError) and cls.code == code
        assert getattr(mk, cls.__name__) is cls


def test_error_message_is_the_librarys_own_with_the_function_and_code_name():
    e = mk.error_for(-40, "mskv_admit", "need 9 pages, 2 free")
    assert isinstance(e, mk.OutOfPagesError)
    assert str(e) == "mskv_admit: %s (MSKV_ERROR_OUT_OF_PAGES): need 9 pages, 2 free" % mk.result_string(-40)
    assert e.code == -40 and e.detail == "need 9 pages, 2 free" and e.function == "mskv_admit"


def test_a_code_this_package_does_not_know_raises_the_base_class_with_its_value():
    e = mk.error_for(-999, "mskv_future")
    assert type(e) is mk.MskvError and e.code == -999
    assert "result -999" in str(e)


def test_failed_call_raises_its_class_with_the_loggers_detail(arena):
    r = arena.add_request()
    with pytest.raises(mk.OutOfPagesError) as info:
        arena.admit([(r, 10_000)])
    assert info.value.code == -40
    assert "pages" in info.value.detail and info.value.detail in str(info.value)
    assert "mskv_admit" in str(info.value)


def test_detail_of_an_earlier_failure_is_not_reused(arena):
    r = arena.add_request()
    with pytest.raises(mk.OutOfPagesError):
        arena.admit([(r, 10_000)])
    with pytest.raises(mk.NoReservationError) as info:
        arena.commit([(r, 1)])
    assert "10000" not in str(info.value) and "pages" not in info.value.detail


def test_invalid_argument_is_also_a_value_error_and_out_of_memory_a_memory_error():
    assert issubclass(mk.InvalidArgumentError, ValueError)
    assert issubclass(mk.InvalidSpecError, ValueError)
    assert issubclass(mk.OutOfMemoryError, MemoryError)
    with pytest.raises(ValueError):
        mk.Arena(num_pages=1, page_size=4)


def test_names_that_would_shadow_builtins_are_renamed():
    assert mk.ERROR_CLASSES[-42] is mk.SizeOverflowError
    assert mk.ERROR_CLASSES[-82] is mk.MskvIOError
    import builtins
    assert getattr(mk, "OverflowError", builtins.OverflowError) is builtins.OverflowError
    assert getattr(mk, "IOError", builtins.IOError) is builtins.IOError
